import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../../helpers/redis.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, codeOf, expectRateLimitHeaders, expectTooManyRequests, keyed } from './httpLimits.ts'

const SKEW_MILLIS = 45_000

describe('gateway replicas sharing one Redis', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  let pets: RunningPetsService
  let a: RunningGateway
  let b: RunningGateway
  /** A gateway whose local clocks run 45 s ahead of everyone else's. */
  let skewed: RunningGateway

  const realNow = Date.now.bind(Date)
  /**
   * Runs one exchange with the skewed gateway while this process's wall clock reads 45 s
   * ahead (its ban cache's monotonic clock is skewed for good). Exchanges are sequential, so
   * no other gateway decides anything meanwhile.
   */
  async function onSkewedGateway(path: string, key: string): Promise<Response> {
    const spy = vi.spyOn(Date, 'now').mockImplementation(() => realNow() + SKEW_MILLIS)
    try {
      const response = await skewed.request(path, { key })
      return new Response(await response.arrayBuffer(), { status: response.status, headers: response.headers })
    } finally {
      spy.mockRestore()
    }
  }

  beforeAll(async () => {
    pets = await startPetsService(database.url)
    const options = {
      databaseUrl: database.url,
      petsUrl: pets.url,
      env: { REDIS_URL: TEST_REDIS_URL },
      configure: (file: Parameters<NonNullable<Parameters<typeof startGateway>[0]['configure']>>[0]) => {
        file.redis.keyPrefix = prefix
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
        file.bans = { strikes: 3, ladder: ['30s'] }
      },
    }
    a = await startGateway(options)
    b = await startGateway(options)
    skewed = await startGateway({ ...options, clock: () => performance.now() + SKEW_MILLIS })
  })
  afterAll(async () => {
    for (const gateway of [a, b, skewed]) await gateway?.close()
    await pets?.close()
  })

  it('300 concurrent requests over three gateways for a 100/min key: exactly 100 admitted, 200 × 429', async () => {
    const { key } = await a.createKey({ plan: 'enterprise', perMinute: 100, perDay: 100_000 })
    const gateways = [a, b, skewed]
    const responses = await Promise.all(
      Array.from({ length: 300 }, async (_, index) => {
        const response = await gateways[index % 3]!.request('/v1/pets?limit=1', { key })
        expectRateLimitHeaders(response, keyed)
        return { status: response.status, code: await codeOf(response) }
      }),
    )
    const count = (status: number) => responses.filter((response) => response.status === status).length
    expect({ admitted: count(200), limited: count(429), other: responses.length - count(200) - count(429) }).toEqual({
      admitted: 100,
      limited: 200,
      other: 0,
    })
    for (const response of responses.filter((entry) => entry.status === 429)) {
      expect(['rate_limited', 'api_key_banned']).toContain(response.code)
    }
  })

  it('a gateway 45 s ahead admits exactly what the others would: time comes from Redis', async () => {
    const { key } = await a.createKey({ plan: 'enterprise', perMinute: 10, perDay: 1_000 })
    const statuses: number[] = []
    for (let i = 0; i < 10; i++) {
      const response = i % 2 === 0 ? await a.request('/v1/pets?limit=1', { key }) : await onSkewedGateway('/v1/pets?limit=1', key)
      statuses.push(response.status)
      const view = expectRateLimitHeaders(response, keyed)
      expect(view.remaining).toBe(9 - i)
      await response.arrayBuffer()
    }
    expect(statuses).toEqual(Array(10).fill(200))
    const fromA = await a.request('/v1/pets?limit=1', { key })
    const fromSkewed = await onSkewedGateway('/v1/pets?limit=1', key)
    const viewA = expectRateLimitHeaders(fromA, keyed)
    const viewSkewed = expectRateLimitHeaders(fromSkewed, keyed)
    const retryA = await expectTooManyRequests(fromA)
    const retrySkewed = await expectTooManyRequests(fromSkewed)
    // Same window, same moment of release: the skewed gateway's own clock shows nowhere.
    expect(Math.abs(viewSkewed.reset - viewA.reset)).toBeLessThanOrEqual(1)
    expect(Math.abs(retrySkewed - retryA)).toBeLessThanOrEqual(1)
  })

  it('a ban set through another gateway holds on the gateway 45 s ahead, for as long as it lasts', async () => {
    const { key } = await a.createKey({ plan: 'enterprise', perMinute: 1, perDay: 1_000 })
    expect((await a.request('/v1/pets?limit=1', { key })).status).toBe(200)
    await expectTooManyRequests(await a.request('/v1/pets?limit=1', { key }), 'rate_limited')
    await expectTooManyRequests(await b.request('/v1/pets?limit=1', { key }), 'rate_limited')
    const banned = await a.request('/v1/pets?limit=1', { key })
    const banView = expectRateLimitHeaders(banned, keyed)
    const banRetry = await expectTooManyRequests(banned, 'api_key_banned')
    // The ban lasts 30 s, but the one admitted request holds the minute window (60 s and its 5 s
    // bucket) longer: Retry-After is when a request is really admitted again.
    expect(banRetry).toBeGreaterThan(30)
    expect(banRetry).toBeLessThanOrEqual(65)
    // The first answer on the skewed gateway comes from Redis, the next ones from its ban cache.
    for (let i = 0; i < 3; i++) {
      const response = await onSkewedGateway('/v1/pets?limit=1', key)
      const view = expectRateLimitHeaders(response, keyed)
      expect(view.remaining).toBe(0)
      const retryAfter = await expectTooManyRequests(response, 'api_key_banned')
      expect(retryAfter).toBeLessThanOrEqual(banRetry)
      expect(retryAfter).toBeGreaterThanOrEqual(banRetry - 2)
      expect(Math.abs(view.reset - banView.reset), `X-RateLimit-Reset on answer ${i}`).toBeLessThanOrEqual(1)
    }
  })
})
