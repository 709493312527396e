import { describe, expect, it } from 'vitest'
import { startGateway } from '../../helpers/gateway.ts'
import { startPetsService } from '../../helpers/petsService.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../../helpers/redis.ts'
import { suiteService } from '../../helpers/suiteService.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, expectRateLimitHeaders, expectTooManyRequests, keyed, sleep } from './httpLimits.ts'

describe('plan windows as a client sees them', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const common = () => ({ databaseUrl: database.url, petsUrl: pets.url, env: { REDIS_URL: TEST_REDIS_URL } })
  const gateway = suiteService(() =>
    startGateway({
      ...common(),
      configure: (file) => {
        file.redis.keyPrefix = `${prefix}plan:`
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
      },
    }),
  )
  const shortWindows = suiteService(() =>
    startGateway({
      ...common(),
      configure: (file) => {
        file.redis.keyPrefix = `${prefix}short:`
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
        file.windows.minute = { length: '2s', bucket: '1s' }
      },
    }),
  )

  it('Free plan: 60 requests admitted with Remaining counting down, then 429 rate_limited', async () => {
    const { key } = await gateway.createKey({ plan: 'free' })
    for (let i = 0; i < 60; i++) {
      const response = await gateway.request('/v1/pets?limit=1', { key })
      expect(response.status).toBe(200)
      const view = expectRateLimitHeaders(response, keyed)
      expect(view.policy.get('minute')).toEqual({ q: 60, w: 60 })
      expect(view.policy.get('day')).toEqual({ q: 1_000, w: 86_400 })
      expect(view).toMatchObject({ limit: 60, remaining: 59 - i })
      expect(view.current.get('day')?.r).toBe(999 - i)
      await response.arrayBuffer()
    }
    const limited = await gateway.request('/v1/pets?limit=1', { key })
    const view = expectRateLimitHeaders(limited, keyed)
    expect(view).toMatchObject({ status: 429, limit: 60, remaining: 0 })
    const retryAfter = await expectTooManyRequests(limited)
    // Everything was admitted within the last few seconds: it leaves the 60 s window (5 s buckets) within 65 s.
    expect(retryAfter).toBeLessThanOrEqual(65)
    expect(retryAfter).toBeGreaterThanOrEqual(50)
  })

  it('a rejected request takes nothing from the day window', async () => {
    const { key } = await gateway.createKey({ plan: 'free' })
    await Promise.all(Array.from({ length: 60 }, () => gateway.request('/v1/store/orders', { key }).then((r) => r.arrayBuffer())))
    for (let i = 0; i < 5; i++) {
      const limited = await gateway.request('/v1/pets', { key })
      const view = expectRateLimitHeaders(limited, keyed)
      expect(view.status).toBe(429)
      expect(view.current.get('minute')?.r).toBe(0)
      expect(view.current.get('day')?.r).toBe(940)
      await expectTooManyRequests(limited)
    }
  })

  it('is admitted again after waiting exactly Retry-After seconds, never sooner', async () => {
    const { key } = await shortWindows.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    let rounds = 0
    let admitted = 0
    while (rounds < 2) {
      const response = await shortWindows.request('/v1/pets?limit=1', { key })
      const view = expectRateLimitHeaders(response, keyed)
      expect(view.policy.get('minute')).toEqual({ q: 2, w: 2 })
      if (response.status === 200) {
        admitted++
        await response.arrayBuffer()
        continue
      }
      const retryAfter = await expectTooManyRequests(response)
      // A 2 s window of 1 s buckets frees a request within 3 s.
      expect(retryAfter).toBeLessThanOrEqual(3)
      await sleep(retryAfter * 1_000)
      const retried = await shortWindows.request('/v1/pets?limit=1', { key })
      expect(retried.status, `retried after Retry-After ${retryAfter}`).toBe(200)
      expectRateLimitHeaders(retried, keyed)
      await retried.arrayBuffer()
      rounds++
    }
    expect(admitted).toBeGreaterThanOrEqual(2)
  })
})
