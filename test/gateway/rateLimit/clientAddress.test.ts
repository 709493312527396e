import { describe, expect, it } from 'vitest'
import { addressOnly, anonymousBucket, knownAddress } from '../../../gateway/src/rateLimit/clientAddress.ts'

describe('the address the anonymous limit counts a client under', () => {
  it.each([
    ['203.0.113.9', '203.0.113.9'],
    ['::ffff:203.0.113.9', '203.0.113.9'],
    ['::FFFF:CB00:7109', '203.0.113.9'],
    ['64:ff9b::203.0.113.9', '203.0.113.9'],
    ['::ffff:0:203.0.113.9', '203.0.113.9'],
    ['2002:cb00:7109::1', '203.0.113.9'],
    // Teredo: the client's IPv4 address is the last 32 bits, inverted (203.0.113.9 → 34ff:8ef6).
    ['2001:0:4136:e378:8000:63bf:34ff:8ef6', '203.0.113.9'],
    ['2001:db8:1:2::1', '2001:db8:1:2::/64'],
    ['2001:DB8:1:2:0:0:0:ffff', '2001:db8:1:2::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    // A trusted load balancer that writes the client's source port too (Azure Application Gateway).
    ['203.0.113.9:40123', '203.0.113.9'],
    ['[2001:db8:1:2::1]:443', '2001:db8:1:2::/64'],
    ['[::ffff:203.0.113.9]:8080', '203.0.113.9'],
    // Other spellings of an IPv4 address count as the address they spell (inet_aton: a leading 0 is octal).
    ['0203.0.113.9', '131.0.113.9'],
    ['203.0.113.011', '203.0.113.9'],
    ['203.0.113.9:0', '203.0.113.9'],
  ])('%s is counted as %s', (address, bucket) => {
    expect(anonymousBucket(address)).toBe(bucket)
  })

  it('counts everything that is not an IP address together, so junk from a trusted proxy mints no fresh counts', () => {
    expect(['unknown', 'garbage:1', '[nope]:80', '999.1.1.1', '1.2.3.256', '256.0.0.0:80', '203.0.113.09'].map(anonymousBucket)).toEqual(Array(7).fill('unparseable'))
  })

  it('counts a request whose socket has no address left (closed before it was read) with them, and forwards it as unknown', () => {
    expect(anonymousBucket(undefined)).toBe('unparseable')
    expect(addressOnly(undefined)).toBe('unknown')
  })
})

describe('the client address the gateway logs and forwards', () => {
  it.each([
    ['203.0.113.9', '203.0.113.9'],
    ['203.0.113.9:40123', '203.0.113.9'],
    ['[2001:db8::1]:443', '2001:db8::1'],
    ['::ffff:203.0.113.9', '::ffff:203.0.113.9'],
    ['aas_0123456789abcdefghijABCDEFGHIJ0123456789', 'unknown'],
    ['garbage:1', 'unknown'],
    ['0x7f.1', 'unknown'],
    ['999.1.1.1', 'unknown'],
    ['01.2.3.4', 'unknown'],
    // A zone id is any text a client chooses (8,000 characters reached the log and the upstream).
    [`fe80::1%${'k'.repeat(8_000)}`, 'unknown'],
    ['fe80::1%eth0 OR 1=1', 'unknown'],
    // As Node gives a link-local peer: the address, without the interface of the host that wrote it.
    ['fe80::fc:ff:fe00:1%eth0', 'fe80::fc:ff:fe00:1'],
    [undefined, 'unknown'],
  ])('%s is given as %s', (address, given) => {
    expect(knownAddress(address)).toBe(given)
  })
})
