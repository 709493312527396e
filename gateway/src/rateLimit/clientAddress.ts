import proxyAddr from '@fastify/proxy-addr'
import ipaddr from 'ipaddr.js'

/**
 * An IPv4 address as a socket reports it: four octets of 0-255, no leading zeros. `999.1.1.1` is
 * no address, and `01.2.3.4` one spelt otherwise: each would be a count of its own.
 */
const OCTET = '(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)'
const PLAIN_IPV4 = new RegExp(`^${OCTET}\\.${OCTET}\\.${OCTET}\\.${OCTET}$`)
const IPV4_WITH_PORT = /^(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}):\d{1,5}$/
const BRACKETED_IPV6 = /^\[([^\]]+)\](?::\d{1,5})?$/
/** A zone as hosts name their interfaces (`eth0`, `en0`, `br-1a2b`, or an index): at most 15 characters. */
const INTERFACE_NAME = /^[\w.-]{1,15}$/

/** Whether `text` is an IPv4 address spelt as a socket reports one (`192.168.10.5`, not `192.168.010.005`). */
export function isPlainIpv4(text: string): boolean {
  return PLAIN_IPV4.test(text)
}

/** Where every client address that is no IP address at all is counted: together, not one count each. */
const UNPARSEABLE_BUCKET = 'unparseable'

/** The client of a request whose socket has no address left (X-Forwarded-For's customary word). */
const UNKNOWN_ADDRESS = 'unknown'

/**
 * The address alone: a trusted load balancer may write the client with its source port
 * (`203.0.113.9:40123`, `[2001:db8::1]:443`, as Azure Application Gateway does), which would
 * otherwise make every connection a client of its own.
 */
export function addressOnly(address: string | undefined): string {
  // No address: a socket closed before anything read it (requestContext reads it first thing).
  if (address === undefined) return UNKNOWN_ADDRESS
  // A socket's IPv4 address, on every request without a trusted proxy: no colon, no port.
  if (!address.includes(':')) return address
  return IPV4_WITH_PORT.exec(address)?.[1] ?? BRACKETED_IPV6.exec(address)?.[1] ?? address
}

/**
 * The client's address as the gateway passes it on (the log line, X-Forwarded-For to the
 * upstream): the address alone, or `unknown` when it is no IP address. A trusted hop may pass on
 * text the client chose (an X-Forwarded-For entry it did not replace), such as a key.
 */
export function knownAddress(given: string | undefined): string {
  const address = addressOnly(given)
  if (PLAIN_IPV4.test(address)) return address
  // A link-local address with its zone (`fe80::1%eth0`, as Node gives a socket's peer) is given
  // without it: the zone names an interface of the host that wrote it, and from a trusted hop's
  // X-Forwarded-For it was any text the client chose (8,000 characters of it reached the log).
  const zoneAt = address.indexOf('%')
  const withoutZone = zoneAt < 0 ? address : address.slice(0, zoneAt)
  if (zoneAt >= 0 && !INTERFACE_NAME.test(address.slice(zoneAt + 1))) return UNKNOWN_ADDRESS
  if (withoutZone.includes(':') && ipaddr.IPv6.isValid(withoutZone)) return withoutZone
  return UNKNOWN_ADDRESS
}

const ipv4 = (high: number, low: number) => `${high >> 8}.${high & 0xff}.${low >> 8}.${low & 0xff}`

/**
 * The IPv4 client an IPv6 address stands for, where it embeds one: IPv4-mapped
 * (`::ffff:1.2.3.4`, as a dual-stack socket reports it) and the translators' prefixes (NAT64
 * 64:ff9b::/96 and SIIT ::ffff:0:0:0/96 in the last 32 bits, 6to4 2002::/16 in bits 16–47,
 * Teredo 2001::/32 in the last 32 bits inverted). Behind such a translator each IPv4 client
 * keeps its own count instead of sharing the translator's /64.
 */
function embeddedIpv4(address: ipaddr.IPv6): string | undefined {
  const parts = address.parts
  switch (address.range()) {
    case 'ipv4Mapped':
    case 'rfc6052':
    case 'rfc6145':
      return ipv4(parts[6] ?? 0, parts[7] ?? 0)
    case '6to4':
      return ipv4(parts[1] ?? 0, parts[2] ?? 0)
    case 'teredo':
      return ipv4(~(parts[6] ?? 0) & 0xffff, ~(parts[7] ?? 0) & 0xffff)
    default:
      return undefined
  }
}

/**
 * What the per-IP anonymous limit counts a client address under, its port left out. IPv4: the
 * address, also when an IPv6 address embeds it (see embeddedIpv4). Other IPv6: its /64, the
 * smallest block a subscriber is given, so one client cannot mint a fresh count from each of the
 * 2^64 addresses of its own network, nor from other spellings of one address (`2001:DB8:0:0::1`
 * and `2001:db8::1` are one client).
 */
export function anonymousBucket(given: string | undefined): string {
  if (given === undefined) return UNPARSEABLE_BUCKET
  if (PLAIN_IPV4.test(given)) return given
  const address = addressOnly(given)
  if (PLAIN_IPV4.test(address)) return address
  if (!ipaddr.isValid(address)) return UNPARSEABLE_BUCKET
  const parsed = ipaddr.parse(address)
  if (parsed.kind() === 'ipv4') return parsed.toString()
  const v6 = parsed as ipaddr.IPv6
  return (
    embeddedIpv4(v6) ??
    `${v6.parts
      .slice(0, 4)
      .map((part) => part.toString(16))
      .join(':')}::/64`
  )
}

/**
 * Fastify's trustProxy for server.trustedProxies: each hop judged by its address alone, so a
 * trusted load balancer that a later hop writes with its source port (`198.51.100.8:40120`, as
 * Azure Application Gateway writes its peer) is still trusted, and the client behind it is found.
 */
export function trustedHops(trustedProxies: readonly string[]): (address: string, hop: number) => boolean {
  const trusted = proxyAddr.compile([...trustedProxies])
  return (address, hop) => trusted(addressOnly(address), hop)
}
