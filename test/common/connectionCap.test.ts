import { describe, expect, it } from 'vitest'
import {
  BASE_RESERVED_FDS,
  FALLBACK_MAX_CONNECTIONS,
  MIN_MAX_CONNECTIONS,
  OPS_MAX_CONNECTIONS,
  connectionBudget,
  openFileLimit,
} from '../../common/src/http/connectionCap.ts'

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max processes             94062                94062                processes
Max open files            1024                 524288               files
Max locked memory         8388608              8388608              bytes
`

describe('the public port connection cap', () => {
  it('reads the soft open-file limit from /proc/self/limits, and nothing where it cannot', () => {
    expect(openFileLimit(() => LIMITS)).toBe(1024)
    expect(openFileLimit(() => LIMITS.replace('1024      ', 'unlimited '))).toBeUndefined()
    expect(openFileLimit(() => { throw Object.assign(new Error('no such file'), { code: 'ENOENT' }) })).toBeUndefined()
    // This process's own, on Linux where the tests run.
    if (process.platform === 'linux') expect(openFileLimit()).toBeGreaterThan(0)
  })

  it('keeps the descriptors the service needs besides its clients out of their reach', () => {
    const outbound = 10 + 1 + 128
    const reserved = BASE_RESERVED_FDS + OPS_MAX_CONNECTIONS + outbound
    expect(connectionBudget({ outboundConnections: outbound, openFileLimit: 1024 })).toEqual({
      maxConnections: 1024 - reserved,
      source: 'open-file limit',
      openFileLimit: 1024,
      reservedFds: reserved,
      overLimit: false,
    })
    expect(connectionBudget({ outboundConnections: outbound, openFileLimit: 1_048_576 }).maxConnections).toBe(1_048_576 - reserved)
  })

  it('takes an operator\'s cap as it is, and says when the open-file limit cannot back it', () => {
    expect(connectionBudget({ configured: 500, outboundConnections: 10, openFileLimit: 20_000 })).toMatchObject({ maxConnections: 500, source: 'configured', overLimit: false })
    expect(connectionBudget({ configured: 5_000, outboundConnections: 10, openFileLimit: 1_024 })).toMatchObject({ maxConnections: 5_000, overLimit: true })
    expect(connectionBudget({ configured: 5_000, outboundConnections: 10 })).toMatchObject({ maxConnections: 5_000, overLimit: false })
  })

  it('falls back to a fixed cap where the limit is unknown, and never derives fewer than the minimum', () => {
    expect(connectionBudget({ outboundConnections: 10 })).toMatchObject({ maxConnections: FALLBACK_MAX_CONNECTIONS, source: 'fallback' })
    expect(connectionBudget({ outboundConnections: 139, openFileLimit: 256 })).toMatchObject({ maxConnections: MIN_MAX_CONNECTIONS, overLimit: true })
  })
})
