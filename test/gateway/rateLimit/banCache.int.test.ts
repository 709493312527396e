import Fastify from 'fastify'
import fp from 'fastify-plugin'
import { pino } from 'pino'
import { describe, expect, it } from 'vitest'
import '../../../gateway/src/auth/authenticate.ts'
import { loadGatewayConfig, type GatewayConfig } from '../../../gateway/src/config/loadConfig.ts'
import { createUnbanApplier } from '../../../gateway/src/keys/applyKeyChange.ts'
import type { ApiKeyRecord } from '../../../gateway/src/keys/keyRepository.ts'
import { createAnonymousLimiter } from '../../../gateway/src/rateLimit/anonymousLimiter.ts'
import { createBanCache } from '../../../gateway/src/rateLimit/banCache.ts'
import type { Limiter } from '../../../gateway/src/rateLimit/limiter.ts'
import { createMemoryStore } from '../../../gateway/src/rateLimit/memoryStore.ts'
import { cachedLimitsFor } from '../../../gateway/src/rateLimit/planLimits.ts'
import { rateLimit } from '../../../gateway/src/rateLimit/rateLimit.ts'
import { connectRedis, createRedisStore, redisReady } from '../../../gateway/src/rateLimit/redisStore.ts'
import { createResilientStore } from '../../../gateway/src/rateLimit/resilientStore.ts'
import { TEST_REDIS_URL, deleteKeysWithPrefix, testKeyPrefix } from '../../helpers/redis.ts'

/** The windows as the store saw them at the ban: the minute spent, the day not. */
const MINUTE_SPENT = { minute: { limit: 60, remaining: 0, resetMillis: 0 }, day: { limit: 1_000, remaining: 900, resetMillis: 0 } }

const silent = pino({ level: 'silent' })
const shipped = loadGatewayConfig('config/gateway.yaml', {})
const key = (id: string): ApiKeyRecord => ({
  id,
  displayPrefix: 'aas_test',
  name: id,
  plan: 'free',
  perMinute: null,
  perDay: null,
  createdAt: new Date(),
  expiresAt: null,
  revokedAt: null,
})

describe('the ban cache and an unban racing a decision on its way to Redis', () => {
  // A request that reached Redis just before the unban is answered "banned", and that answer can
  // arrive after the unban is done: cached, it would keep the lifted ban on this gateway for as
  // long as the ban had left, here a day.
  for (const unbanAfter of ['in the same turn', 'a turn later'] as const) {
    it(`keeps no ban an earlier request reports once the unban is applied (unban ${unbanAfter})`, async () => {
      const keyPrefix = testKeyPrefix()
      const redis = connectRedis({ url: TEST_REDIS_URL, keyPrefix, commandTimeoutMillis: 200 })
      try {
        expect(await redisReady(redis, 2_000)).toBe(true)
        const store = createResilientStore({ primary: createRedisStore(redis, { budgetMillis: 200 }), fallback: undefined, logger: silent })
        const bans = createBanCache()
        const limiter = { store, bans } as unknown as Limiter
        const unbans = createUnbanApplier({ repository: { pendingUnbans: async () => [], markUnbanApplied: async () => true }, limiter, logger: silent })
        const limits = cachedLimitsFor(key('key_race'), { ...shipped, plans: { ...shipped.plans, free: { perMinute: 1, perDay: 1_000 } } } as GatewayConfig)
        const request = { keyId: 'key_race', ...limits, bans: { strikes: 1, ladderMillis: [86_400_000], memoryMillis: 86_400_000 } }
        expect((await store.consume(request)).outcome).toBe('admitted')
        expect((await store.consume(request)).outcome).toBe('banned')

        // What the rate-limit stage does for a key it does not know to be banned.
        const decided = (async () => {
          const ticket = bans.ticket()
          const decision = await store.consume(request)
          if (decision.outcome === 'banned') bans.remember('key_race', ticket, limits, decision)
          return decision.outcome
        })()
        if (unbanAfter === 'a turn later') await new Promise((resolve) => setImmediate(resolve))
        await unbans.apply({ id: 1, keyId: 'key_race', keyHash: Buffer.alloc(0), kind: 'unban', applied: false })
        expect(await decided).toBe('banned')

        expect(bans.lookup('key_race', limits)).toBeUndefined()
        expect((await store.consume({ ...request, minute: { ...request.minute, limit: 100 } })).outcome).toBe('admitted')
      } finally {
        redis.disconnect()
        await deleteKeysWithPrefix(keyPrefix)
      }
    })
  }
})

describe('a cached ban after the key\'s limits change', () => {
  it('answers with a Retry-After a request is really admitted at, computed under the new limits', async () => {
    const T0 = 1_800_000_000_000
    let now = T0
    const withFree = (perMinute: number): GatewayConfig =>
      ({ ...shipped, plans: { ...shipped.plans, free: { perMinute, perDay: 1_000 } }, bans: { strikes: 1, ladderSeconds: [10] } }) as GatewayConfig
    let config = withFree(5)
    const { app, get } = await limitStage(() => config, 'key_lowered', () => now)
    try {

      for (let i = 0; i < 3; i++) expect((await get()).statusCode).toBe(200)
      now = T0 + 30_000
      for (let i = 0; i < 2; i++) expect((await get()).statusCode).toBe(200)
      now = T0 + 31_000
      // Limited, one strike, a 10 s ban; on 5 a minute a request is admitted again at T0 + 65 s.
      const banned = await get()
      expect(banned.json()).toMatchObject({ code: 'api_key_banned' })
      expect(banned.headers['retry-after']).toBe('34')

      // The operator lowers free to 2 a minute: with the five requests counted, the next is
      // admitted once four have left the window, at T0 + 95 s, not at T0 + 65 s.
      config = withFree(2)
      now = T0 + 32_000
      const cached = await get()
      expect(cached.json()).toMatchObject({ code: 'api_key_banned' })
      const retryAfter = Number(cached.headers['retry-after'])
      expect(retryAfter).toBe(63)
      now += retryAfter * 1_000
      expect((await get()).statusCode).toBe(200)
    } finally {
      await app.close()
    }
  })
})

/** The rate-limit stage alone, for one free key, on an in-process store and ban cache driven by `clock`. */
async function limitStage(config: () => GatewayConfig, keyId: string, clock: () => number) {
  const app = Fastify()
  await app.register(
    fp(
      async (instance) => {
        instance.decorateRequest('apiKey', null)
        instance.decorateRequest('authFailureReason', null)
        instance.addHook('onRequest', (request, _reply, done) => {
          request.apiKey = key(keyId)
          done()
        })
      },
      { name: 'authenticate' },
    ),
  )
  await app.register(rateLimit, {
    config,
    store: createResilientStore({ primary: createMemoryStore({ clock }), fallback: undefined, logger: silent }),
    bans: createBanCache({ clock }),
    anonymous: () => createAnonymousLimiter({ perMinute: 30, windowSeconds: 60 }),
  })
  app.get('/v1/pets', async () => ({ data: [] }))
  return { app, get: () => app.inject({ method: 'GET', url: '/v1/pets' }) }
}

describe('429 answers as a client reads them', () => {
  const T0 = 1_800_000_000_000
  const freeAt = (perMinute: number, perDay: number, strikes: number) =>
    ({ ...shipped, plans: { ...shipped.plans, free: { perMinute, perDay } }, bans: { strikes, ladderSeconds: [10] } }) as GatewayConfig

  it('a banned answer says nothing is left until Retry-After, whether the store or the ban cache answers', async () => {
    let now = T0
    const { app, get } = await limitStage(() => freeAt(2, 1_000, 1), 'key_bannedHeaders', () => now)
    try {
      for (let i = 0; i < 2; i++) expect((await get()).statusCode).toBe(200)
      now = T0 + 1_000
      // One strike bans for 10 s; the minute window lets a request in only at T0 + 65 s.
      const fromStore = await get()
      expect(fromStore.json()).toMatchObject({ code: 'api_key_banned' })
      expect(fromStore.headers['retry-after']).toBe('64')
      expect(fromStore.headers['x-ratelimit-remaining']).toBe('0')
      expect(fromStore.headers['x-ratelimit-reset']).toBe(String(T0 / 1_000 + 65))
      expect(fromStore.headers.ratelimit).toBe('"minute";r=0;t=64, "day";r=0;t=64')

      now = T0 + 2_000
      const fromCache = await get()
      expect(fromCache.json()).toMatchObject({ code: 'api_key_banned' })
      expect(fromCache.headers['retry-after']).toBe('63')
      expect(fromCache.headers.ratelimit).toBe('"minute";r=0;t=63, "day";r=0;t=63')
      // On the store's clock, as the store's own answer was (here years from this host's): the same
      // moment, give or take the second the two clocks are read apart.
      expect(Number(fromCache.headers['x-ratelimit-reset']) - (T0 / 1_000 + 65)).toBeGreaterThanOrEqual(-1)
      expect(Number(fromCache.headers['x-ratelimit-reset']) - (T0 / 1_000 + 65)).toBeLessThanOrEqual(0)
    } finally {
      await app.close()
    }
  })

  it('a key that has spent its day is told to come back when the day lets it in, not the minute', async () => {
    let now = T0
    const { app, get } = await limitStage(() => freeAt(60, 3, 10), 'key_daySpent', () => now)
    try {
      for (let i = 0; i < 3; i++) expect((await get()).statusCode).toBe(200)
      now = T0 + 1_000
      const limited = await get()
      expect(limited.json()).toMatchObject({ code: 'rate_limited' })
      // The three requests sit in the hour bucket starting at T0: they leave the day at T0 + 25 h.
      expect(limited.headers['retry-after']).toBe(String(25 * 3_600 - 1))
      expect(limited.headers['x-ratelimit-limit']).toBe('3')
      expect(limited.headers['x-ratelimit-reset']).toBe(String(T0 / 1_000 + 25 * 3_600))
    } finally {
      await app.close()
    }
  })

  it('a ban whose Retry-After equals an earlier rate_limited answer\'s is still api_key_banned', async () => {
    let now = T0
    const { app, get } = await limitStage(() => freeAt(1, 1_000, 2), 'key_sameSeconds', () => now)
    try {
      expect((await get()).statusCode).toBe(200)
      now = T0 + 1_000
      const limited = await get()
      expect(limited.json()).toMatchObject({ code: 'rate_limited' })
      expect(limited.headers['retry-after']).toBe('64')
      // The second strike bans (10 s), and the window still frees at T0 + 65 s: the same 64 seconds.
      const banned = await get()
      expect(banned.headers['retry-after']).toBe('64')
      expect(banned.json()).toMatchObject({ code: 'api_key_banned' })
    } finally {
      await app.close()
    }
  })
})

describe('the ban cache after an unban', () => {
  it('holds the next ban the key earns once the unban is applied, without a store call per request', () => {
    const bans = createBanCache({ clock: () => 0 })
    const limits = cachedLimitsFor(key('key_bannedAgain'), shipped)
    bans.forget('key_bannedAgain')
    // A request decided after the unban: its ban is the key's new one, and is kept.
    const ticket = bans.ticket()
    bans.remember('key_bannedAgain', ticket, limits, { nowMillis: 0, banMillisLeft: 30_000, retryAfterMillis: 30_000, banStep: 1, ...MINUTE_SPENT })
    expect(bans.lookup('key_bannedAgain', limits)).toEqual({ millisLeft: 30_000, retryAfterMillis: 30_000, admittedAtStoreMillis: 30_000, step: 1, window: 0 })
  })
})

describe('a cached ban after a reload changes the window length', () => {
  it('asks the store again: a longer window keeps the key out for longer than the cached moment', async () => {
    const T0 = 1_800_000_000_000
    let now = T0
    const withMinute = (lengthMillis: number): GatewayConfig =>
      ({
        ...shipped,
        plans: { ...shipped.plans, free: { perMinute: 2, perDay: 1_000 } },
        windows: { ...shipped.windows, minute: { lengthMillis, bucketMillis: 5_000 } },
        bans: { strikes: 1, ladderSeconds: [10] },
      }) as GatewayConfig
    let config = withMinute(60_000)
    const { app, get } = await limitStage(() => config, 'key_longerWindow', () => now)
    try {
      for (let i = 0; i < 2; i++) expect((await get()).statusCode).toBe(200)
      now = T0 + 1_000
      const banned = await get()
      expect(banned.json()).toMatchObject({ code: 'api_key_banned' })
      expect(banned.headers['retry-after']).toBe('64')

      // Same limits, a two-minute window: the two requests at T0 keep the key out until T0 + 125 s.
      config = withMinute(120_000)
      now = T0 + 2_000
      const cached = await get()
      expect(cached.json()).toMatchObject({ code: 'api_key_banned' })
      expect(cached.headers['retry-after']).toBe('123')
    } finally {
      await app.close()
    }
  })
})
