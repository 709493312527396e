import { describe, expect, it } from 'vitest'
import { createBanCache } from '../../../gateway/src/rateLimit/banCache.ts'
import type { KeyLimits } from '../../../gateway/src/rateLimit/planLimits.ts'

/** The windows as the store saw them at the ban: the minute spent, the day not. */
const MINUTE_SPENT = { minute: { limit: 60, remaining: 0, resetMillis: 0 }, day: { limit: 1_000, remaining: 900, resetMillis: 0 } }

const limits: KeyLimits = {
  minute: { limit: 60, windowMillis: 60_000, bucketMillis: 5_000 },
  day: { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
}

describe('a cached ban as a banned key sees it', () => {
  it('ends at the instant the ban does: no 429 with nothing left of the ban', () => {
    let now = 0
    const bans = createBanCache({ clock: () => now })
    bans.remember('key_ending', bans.ticket(), limits, { nowMillis: 1_000_000, banMillisLeft: 10_000, retryAfterMillis: 10_000, banStep: 0, ...MINUTE_SPENT })
    now = 9_999
    expect(bans.lookup('key_ending', limits)).toEqual({ millisLeft: 1, retryAfterMillis: 1, admittedAtStoreMillis: 1_010_000, step: 0, window: 0 })
    now = 10_000
    expect(bans.lookup('key_ending', limits)).toBeUndefined()
  })

  it('never tells the key to retry before its ban ends, whatever wait the store gave', () => {
    let now = 0
    const bans = createBanCache({ clock: () => now })
    bans.remember('key_early', bans.ticket(), limits, { nowMillis: 1_000_000, banMillisLeft: 30_000, retryAfterMillis: 5_000, banStep: 1, ...MINUTE_SPENT })
    now = 1_000
    expect(bans.lookup('key_early', limits)).toEqual({ millisLeft: 29_000, retryAfterMillis: 29_000, admittedAtStoreMillis: 1_030_000, step: 1, window: 0 })
  })

  it('names the window that held the key back when the store saw the ban: the day, when the day was spent and the minute was not', () => {
    const bans = createBanCache({ clock: () => 0 })
    const daySpent = { minute: { limit: 60, remaining: 12, resetMillis: 0 }, day: { limit: 1_000, remaining: 0, resetMillis: 0 } }
    bans.remember('key_daySpent', bans.ticket(), limits, { nowMillis: 0, banMillisLeft: 10_000, retryAfterMillis: 10_000, banStep: 0, ...daySpent })
    expect(bans.lookup('key_daySpent', limits)?.window).toBe(1)
  })

  it('names the minute for a ban whose minute has freed since while the day has room: as every gateway does, whenever it saw the ban', () => {
    const bans = createBanCache({ clock: () => 0 })
    const minuteFreed = { minute: { limit: 60, remaining: 60, resetMillis: 0 }, day: { limit: 100, remaining: 40, resetMillis: 0 } }
    bans.remember('key_minuteFreed', bans.ticket(), limits, { nowMillis: 0, banMillisLeft: 600_000, retryAfterMillis: 600_000, banStep: 0, ...minuteFreed })
    expect(bans.lookup('key_minuteFreed', limits)?.window).toBe(0)
  })
})
