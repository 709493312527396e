import { Registry } from 'prom-client'
import { describe, expect, it } from 'vitest'
import { createGatewayMetrics } from '../../../gateway/src/metrics/gatewayMetrics.ts'
import { createBanCache } from '../../../gateway/src/rateLimit/banCache.ts'
import type { KeyLimits } from '../../../gateway/src/rateLimit/planLimits.ts'

/** The windows as the store saw them at the ban: the minute spent, the day not. */
const MINUTE_SPENT = { minute: { limit: 60, remaining: 0, resetMillis: 0 }, day: { limit: 1_000, remaining: 900, resetMillis: 0 } }

const limits: KeyLimits = {
  minute: { limit: 60, windowMillis: 60_000, bucketMillis: 5_000 },
  day: { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
}

describe('gateway_active_bans', () => {
  async function scrape(registry: Registry): Promise<string | undefined> {
    return (await registry.metrics()).split('\n').find((line) => line.startsWith('gateway_active_bans '))
  }

  // A banned client usually stops calling, or was unbanned elsewhere: its ban is then never
  // looked up again, and the gauge read 1 for bans that had ended minutes before (soak test).
  it('counts a ban until it ends, also when its key sends no request after that', async () => {
    let now = 0
    const bans = createBanCache({ clock: () => now })
    const registry = new Registry()
    createGatewayMetrics(registry).observeBans(bans)

    bans.remember('key_short', bans.ticket(), limits, { nowMillis: 0, banMillisLeft: 10_000, retryAfterMillis: 10_000, banStep: 0, ...MINUTE_SPENT })
    bans.remember('key_long', bans.ticket(), limits, { nowMillis: 0, banMillisLeft: 60_000, retryAfterMillis: 60_000, banStep: 2, ...MINUTE_SPENT })
    expect(await scrape(registry)).toBe('gateway_active_bans 2')

    now = 10_000
    expect(await scrape(registry)).toBe('gateway_active_bans 1')
    now = 60_000
    expect(await scrape(registry)).toBe('gateway_active_bans 0')
  })
})
