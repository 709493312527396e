import { describe, expect, it } from 'vitest'
import { createBanCache } from '../../../gateway/src/rateLimit/banCache.ts'
import type { KeyLimits } from '../../../gateway/src/rateLimit/planLimits.ts'

const limits: KeyLimits = {
  minute: { limit: 60, windowMillis: 60_000, bucketMillis: 5_000 },
  day: { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
}

describe('a cached ban as a banned key sees it', () => {
  it('ends at the instant the ban does: no 429 with nothing left of the ban', () => {
    let now = 0
    const bans = createBanCache({ clock: () => now })
    bans.remember('key_ending', bans.ticket(), limits, { nowMillis: 1_000_000, banMillisLeft: 10_000, retryAfterMillis: 10_000, banStep: 0 })
    now = 9_999
    expect(bans.lookup('key_ending', limits)).toEqual({ millisLeft: 1, retryAfterMillis: 1, admittedAtStoreMillis: 1_010_000, step: 0 })
    now = 10_000
    expect(bans.lookup('key_ending', limits)).toBeUndefined()
  })

  it('never tells the key to retry before its ban ends, whatever wait the store gave', () => {
    let now = 0
    const bans = createBanCache({ clock: () => now })
    bans.remember('key_early', bans.ticket(), limits, { nowMillis: 1_000_000, banMillisLeft: 30_000, retryAfterMillis: 5_000, banStep: 1 })
    now = 1_000
    expect(bans.lookup('key_early', limits)).toEqual({ millisLeft: 29_000, retryAfterMillis: 29_000, admittedAtStoreMillis: 1_030_000, step: 1 })
  })
})
