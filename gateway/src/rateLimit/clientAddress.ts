import ipaddr from 'ipaddr.js'

const PLAIN_IPV4 = /^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$/

/**
 * What the per-IP anonymous limit counts a client address under. IPv4: the address, also when it
 * is written IPv4-mapped (`::ffff:1.2.3.4`, as a dual-stack socket reports it). IPv6: its /64,
 * the smallest block a subscriber is given, so one client cannot mint a fresh count from each of
 * the 2^64 addresses of its own network, nor from other spellings of one address
 * (`2001:DB8:0:0::1` and `2001:db8::1` are one client).
 */
export function anonymousBucket(address: string): string {
  if (PLAIN_IPV4.test(address)) return address
  if (!ipaddr.isValid(address)) return address
  const parsed = ipaddr.parse(address)
  if (parsed.kind() === 'ipv4') return parsed.toString()
  const v6 = parsed as ipaddr.IPv6
  if (v6.isIPv4MappedAddress()) return v6.toIPv4Address().toString()
  return `${v6.parts
    .slice(0, 4)
    .map((part) => part.toString(16))
    .join(':')}::/64`
}
