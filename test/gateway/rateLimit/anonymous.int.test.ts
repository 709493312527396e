import { Redis } from 'ioredis'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { generateApiKey, hashApiKey } from '../../../gateway/src/keys/apiKeyFormat.ts'
import { createAnonymousLimiter } from '../../../gateway/src/rateLimit/anonymousLimiter.ts'
import { expectErrorResponse } from '../../helpers/assertions.ts'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { startPetsService } from '../../helpers/petsService.ts'
import { TEST_REDIS_URL, keyNames, suiteKeyPrefix } from '../../helpers/redis.ts'
import { openRaw, type RawConnection } from '../../helpers/rawClient.ts'
import { suiteService } from '../../helpers/suiteService.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, anonymous, eventually, expectRateLimitHeaders, expectTooManyRequests, keyed, sleep } from './httpLimits.ts'

describe('requests without a valid key are limited per client IP', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateways: RunningGateway[] = []
  let created = 0

  /** A gateway with its own Redis prefix, so every test starts with untouched per-IP buckets. */
  async function gateway(trustedProxies: string[] = [], keyPrefix = `${prefix}${created++}:`): Promise<RunningGateway> {
    const started = await startGateway({
      databaseUrl: database.url,
      petsUrl: pets.url,
      env: { REDIS_URL: TEST_REDIS_URL },
      configure: (file) => {
        file.redis.keyPrefix = keyPrefix
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
        file.anonymous.perMinute = 3
        file.server.trustedProxies = trustedProxies
      },
    })
    gateways.push(started)
    return started
  }

  // Each test's gateways go with it: kept to the end of the file, their pools and change-feed
  // connections added up to Postgres's max_connections beside the other files running meanwhile.
  afterEach(async () => {
    for (const started of gateways.splice(0)) await started.close()
  })

  it('answers 401 three times, then 429 rate_limited, whether the key is missing, malformed or unknown', async () => {
    const g = await gateway()
    const attempts = [{}, { key: 'aas_not-a-real-key' }, { key: generateApiKey() }]
    for (const [index, init] of attempts.entries()) {
      const response = await g.request('/v1/pets', init)
      const view = expectRateLimitHeaders(response, anonymous)
      expect(view.policy.get('anonymous')).toEqual({ q: 3, w: 60 })
      expect(view).toMatchObject({ status: 401, limit: 3, remaining: 2 - index })
      await response.arrayBuffer()
    }
    for (const init of attempts) {
      const limited = await g.request('/v1/pets', init)
      expect(expectRateLimitHeaders(limited, anonymous)).toMatchObject({ limit: 3, remaining: 0 })
      expect(await expectTooManyRequests(limited)).toBeLessThanOrEqual(60)
    }
  })

  it('refuses an address past its limit from memory: 20 more guesses leave its Redis count where the limit left it', async () => {
    const g = await gateway()
    const gatewayPrefix = g.config.redis.keyPrefix
    for (let i = 0; i < 3; i++) await expectErrorResponse(await g.request('/v1/pets', { key: generateApiKey() }), 401, 'invalid_api_key')
    for (let i = 0; i < 20; i++) {
      const refused = await g.request('/v1/pets', { key: generateApiKey() })
      expect(expectRateLimitHeaders(refused, anonymous)).toMatchObject({ limit: 3, remaining: 0 })
      // Answered from memory, the refusal still says when the window Redis reported ends.
      expect(await expectTooManyRequests(refused)).toBeLessThanOrEqual(60)
    }
    const [counter, ...others] = await keyNames(`${gatewayPrefix}*anon*`)
    expect(others).toEqual([])
    const redis = new Redis(TEST_REDIS_URL)
    try {
      // rate-limiter-flexible adds one per request it sends to Redis, refused or not.
      expect(await redis.get(counter as string)).toBe('3')
    } finally {
      redis.disconnect()
    }
  })

  // Anyone can compute a valid checksum, so a flood of invented keys would otherwise cost a
  // Postgres query each, refused or not. Keys the gateway already holds are not affected.
  it('looks up only as many keys as its limit once an address has spent it: a flood of invented keys costs 3 Postgres queries', async () => {
    const g = await gateway()
    const inUse = await g.createKey({ plan: 'free' })
    const notYetSeen = await g.createKey({ plan: 'free' })
    // Each creation is announced to the gateway, which then drops the key from its cache: wait for
    // both announcements, so the key in use stays cached from its first request on.
    await g.announced(inUse.key, notYetSeen.key)
    expect((await g.request('/v1/pets', { key: inUse.key })).status).toBe(200)
    for (let i = 0; i < 3; i++) await expectErrorResponse(await g.request('/v1/pets', { key: generateApiKey() }), 401, 'invalid_api_key')
    const lookups = g.cache.stats.misses
    for (let i = 0; i < 20; i++) {
      const refused = await g.request('/v1/pets', { key: generateApiKey() })
      expect(expectRateLimitHeaders(refused, anonymous)).toMatchObject({ limit: 3, remaining: 0 })
      expect(await expectTooManyRequests(refused)).toBeLessThanOrEqual(60)
    }
    expect(g.cache.stats.misses - lookups).toBe(3)
    // Past those, a real key the gateway has not seen is not looked up either, until the window frees …
    await expectTooManyRequests(await g.request('/v1/pets', { key: notYetSeen.key }))
    expect(g.cache.stats.misses - lookups).toBe(3)
    // … while a key it holds passes as always.
    expect((await g.request('/v1/pets', { key: inUse.key })).status).toBe(200)
    // The operator's auth-failure panel tells the keys refused unread from those looked up in vain.
    const failures = await g.registry.getSingleMetricAsString('gateway_auth_failures_total')
    expect(failures).toMatch(/^gateway_auth_failures_total\{reason="unknown"\} 6$/m)
    expect(failures).toMatch(/^gateway_auth_failures_total\{reason="over_ip_limit"\} 18$/m)
  })

  /** What the gateway answered on raw connections so far: statuses and Retry-After values. */
  function answersOn(connections: RawConnection[]) {
    const all = (pattern: RegExp) => connections.flatMap((connection) => [...connection.answer().matchAll(pattern)].map((match) => match[1]!))
    return { statuses: () => all(/HTTP\/1\.1 (\d{3}) /g), retryAfters: () => all(/retry-after: (\d+)/g).map(Number) }
  }

  const get = (key: string) => `GET /v1/pets HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ${key}\r\n\r\n`

  /** Each connection's requests written in one turn, every connection opened first. */
  async function sendAtOnce(g: RunningGateway, requests: string[]): Promise<RawConnection[]> {
    const connections = await Promise.all(requests.map(() => openRaw(g.url)))
    for (const [index, connection] of connections.entries()) connection.socket.write(requests[index]!)
    return connections
  }

  /** Keys the gateway does not hold: created, and their creations' announcements come. */
  async function uncachedKeys(g: RunningGateway, count: number): Promise<string[]> {
    const keys = (await Promise.all(Array.from({ length: count }, () => g.createKey({ plan: 'enterprise', perMinute: 100_000, perDay: 1_000_000 })))).map(({ key }) => key)
    await g.announced(...keys)
    return keys
  }

  /** Every connection of the gateway's Postgres pool taken, so its lookups wait; returns what frees them. */
  async function holdPool(g: RunningGateway): Promise<() => void> {
    const busy = await Promise.all(Array.from({ length: g.pool.options.max }, () => g.pool.connect()))
    return () => {
      for (const client of busy.splice(0)) client.release()
    }
  }

  // Requests that arrive together all reach authentication before the first of them is charged:
  // a lookup under way counts as the guess it may be, or a flood sent at once would all be looked up.
  it('looks up no more keys for a flood sent all at once, pipelined on ten connections, than for one sent in turn', async () => {
    const g = await gateway()
    const lookups = g.cache.stats.misses
    const connections = await sendAtOnce(g, Array.from({ length: 10 }, () => Array.from({ length: 50 }, () => get(generateApiKey())).join('')))
    try {
      const { statuses, retryAfters } = answersOn(connections)
      await eventually(async () => statuses().length === 500, 30_000)
      // Three within the limit (401), three more past it (429 after their lookup), then none.
      expect(g.cache.stats.misses - lookups).toBe(6)
      expect(statuses().filter((status) => status === '401')).toHaveLength(3)
      expect(statuses().filter((status) => status === '429')).toHaveLength(497)
      // Each refusal waits for the window: the guesses under way when it was answered count too.
      expect(retryAfters()).toHaveLength(497)
      expect(Math.min(...retryAfters())).toBeGreaterThan(30)
    } finally {
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // The other side of counting lookups under way: one real key arriving on many connections at
  // once (a client's pool warming up on a gateway that does not hold the key yet) is one lookup.
  it('admits a burst of one real key it does not hold yet, sent on twenty connections while its lookup waits, with one lookup', async () => {
    const g = await gateway()
    const [key] = await uncachedKeys(g, 1)
    const lookups = g.cache.stats.misses
    // The key's lookup waits for a connection, and with it every request for the key meanwhile.
    const release = await holdPool(g)
    const connections = await sendAtOnce(g, Array.from({ length: 20 }, () => get(key!)))
    try {
      await sleep(300)
      release()
      const { statuses } = answersOn(connections)
      await eventually(async () => statuses().length === 20, 10_000)
      expect(statuses()).toEqual(connections.map(() => '200'))
      expect(g.cache.stats.misses - lookups).toBe(1)
    } finally {
      release()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  /**
   * Holds the first `count` key lookups the gateway makes before they reach Postgres, until the
   * returned function is called; later lookups go straight through.
   */
  function holdLookups(g: RunningGateway, count: number): { held: () => number; release: () => void } {
    const findByHash = g.keys.findByHash.bind(g.keys)
    let release!: () => void
    const gate = new Promise<void>((resolve) => (release = resolve))
    let calls = 0
    const spy = vi.spyOn(g.keys, 'findByHash').mockImplementation(async (hash) => {
      if (++calls <= count) await gate
      return findByHash(hash)
    })
    return {
      held: () => Math.min(calls, count),
      release: () => {
        release()
        spy.mockRestore()
      },
    }
  }

  // A colleague behind the same NAT as a guesser: the address has spent its window, and their
  // client opens twenty connections at once with a key this gateway does not hold yet. It is one
  // lookup, and one of the address's places for lookups, however many requests wait for it.
  it('admits a burst of one real key from an address that has spent its limit, sent on twenty connections while its lookup waits', async () => {
    const g = await gateway()
    const [key] = await uncachedKeys(g, 1)
    for (let i = 0; i < 3; i++) await expectErrorResponse(await g.request('/v1/pets'), 401, 'missing_api_key')
    await expectTooManyRequests(await g.request('/v1/pets'))
    const lookups = holdLookups(g, 1)
    const authenticated = vi.spyOn(g.cache, 'cached')
    const connections = await sendAtOnce(g, Array.from({ length: 20 }, () => get(key!)))
    try {
      // Every request has reached authentication while the one lookup is held.
      await eventually(async () => authenticated.mock.calls.length >= 20 && lookups.held() === 1, 10_000, 20)
      lookups.release()
      const { statuses } = answersOn(connections)
      await eventually(async () => statuses().length === 20, 10_000)
      expect(statuses()).toEqual(connections.map(() => '200'))
    } finally {
      lookups.release()
      authenticated.mockRestore()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // A request waiting for its address's lookups under way goes after a second, whether or not
  // they ever answer: lookups that hang (Postgres stopped, a lock) hold back only themselves.
  it('looks up a key while the address\'s lookups under way hang, instead of waiting for them', async () => {
    const g = await gateway()
    const keys = await uncachedKeys(g, 4)
    const lookups = holdLookups(g, 3)
    const connections = await sendAtOnce(g, keys.slice(0, 3).map(get))
    let fourth: number | undefined
    try {
      await eventually(async () => lookups.held() === 3, 10_000, 20)
      const answered = g.request('/v1/pets', { key: keys[3] }).then(async (response) => {
        await response.arrayBuffer()
        fourth = response.status
      })
      await eventually(async () => fourth !== undefined, 15_000, 50)
      expect(fourth).toBe(200)
      // The three it waited for are still held: it did not wait for them.
      expect(answersOn(connections).statuses()).toEqual([])
      await answered
      lookups.release()
      const { statuses } = answersOn(connections)
      await eventually(async () => statuses().length === 3, 10_000)
      expect(statuses()).toEqual(['200', '200', '200'])
    } finally {
      lookups.release()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // Past its wait, a request goes as one of the address's few overdue lookups: a flood of invented
  // keys while Postgres hangs costs twice the limit in queries, not one each, and the rest are told
  // to come back.
  it('looks up six keys of twenty invented ones sent at once while Postgres hangs, and answers the other fourteen 503 with Retry-After', async () => {
    const g = await gateway()
    const lookups = holdLookups(g, 100)
    const connections = await sendAtOnce(g, Array.from({ length: 20 }, () => get(generateApiKey())))
    try {
      const { statuses, retryAfters } = answersOn(connections)
      await eventually(async () => statuses().length === 14, 10_000, 50)
      expect(statuses()).toEqual(Array.from({ length: 14 }, () => '503'))
      expect(retryAfters().every((seconds) => seconds >= 1)).toBe(true)
      expect(connections.filter((connection) => connection.answer().includes('"code":"service_unavailable"'))).toHaveLength(14)
      expect(lookups.held()).toBe(6)
      lookups.release()
      await eventually(async () => statuses().length === 20, 10_000, 50)
      // Charged as they settle: three guesses take the address's limit, the other three are over it.
      expect(statuses().filter((status) => status !== '503').sort()).toEqual(['401', '401', '401', '429', '429', '429'])
    } finally {
      lookups.release()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // The other side of limiting lookups once an address has spent its window: each real key found
  // gives its place back, so colleagues behind a guesser's NAT are not locked out after three keys.
  it('admits every real key it does not hold, one after another, from an address that has spent its limit', async () => {
    const g = await gateway()
    const keys = await uncachedKeys(g, 5)
    for (let i = 0; i < 3; i++) await expectErrorResponse(await g.request('/v1/pets'), 401, 'missing_api_key')
    await expectTooManyRequests(await g.request('/v1/pets'))
    for (const key of keys) {
      const response = await g.request('/v1/pets', { key })
      expect(response.status).toBe(200)
      await response.arrayBuffer()
    }
    // The address is still refused for what it spent.
    await expectTooManyRequests(await g.request('/v1/pets', { key: generateApiKey() }))
  })

  // Another gateway spent the address's shared window; this one refuses a key it does not look up
  // (its address's lookups all under way) with a wait until that window frees, not "retry in 1 s".
  it('refuses a key it does not look up, for an address Redis says has spent the shared window, with a wait until that window frees', async () => {
    const shared = `${prefix}refusal:`
    const [one, two] = [await gateway([], shared), await gateway([], shared)]
    for (let i = 0; i < 3; i++) await expectErrorResponse(await one!.request('/v1/pets', { key: generateApiKey() }), 401, 'invalid_api_key')
    // One guess here learns from Redis that the window is spent.
    expect(await expectTooManyRequests(await two!.request('/v1/pets', { key: generateApiKey() }))).toBeGreaterThan(30)
    const lookups = holdLookups(two!, 3)
    const connections = await sendAtOnce(two!, Array.from({ length: 3 }, () => get(generateApiKey())))
    try {
      await eventually(async () => lookups.held() === 3, 10_000, 20)
      const refused = await two!.request('/v1/pets', { key: generateApiKey() })
      expect(expectRateLimitHeaders(refused, anonymous)).toMatchObject({ limit: 3, remaining: 0 })
      expect(await expectTooManyRequests(refused)).toBeGreaterThan(30)
    } finally {
      lookups.release()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // An address's window in the gateway's memory frees like any other: a client that waited for
  // its Retry-After is answered again (here a 2 s window).
  it('admits an address again once its window has passed', async () => {
    const g = await startGateway({
      databaseUrl: database.url,
      petsUrl: pets.url,
      configure: (file) => {
        file.anonymous.perMinute = 3
        file.windows.minute = { length: '2s', bucket: '1s' }
      },
    })
    gateways.push(g)
    for (let i = 0; i < 3; i++) await expectErrorResponse(await g.request('/v1/pets'), 401, 'missing_api_key')
    await expectTooManyRequests(await g.request('/v1/pets'))
    await eventually(async () => {
      const response = await g.request('/v1/pets')
      await response.arrayBuffer()
      return response.status === 401
    }, 15_000, 250)
  })

  // Many real keys behind one address (an office's NAT, a cold cache after a restart) are not a
  // flood: past the room its window has for lookups under way, they wait their turn, none refused.
  it('admits seven distinct real keys it does not hold, sent at once while their lookups wait, none refused', async () => {
    const g = await gateway()
    const keys = await uncachedKeys(g, 7)
    const release = await holdPool(g)
    const connections = await sendAtOnce(g, keys.map(get))
    try {
      await sleep(300)
      release()
      const { statuses } = answersOn(connections)
      await eventually(async () => statuses().length === 7, 10_000)
      expect(statuses()).toEqual(connections.map(() => '200'))
    } finally {
      release()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // With Postgres slow, lookups take seconds: a request waiting for the others under way at its
  // address goes after a second, instead of waiting in line behind each (rounds of 2 s apiece here).
  it('answers twelve distinct keys from one address within a second past its own lookup\'s bound while Postgres cannot be reached', async () => {
    const g = await gateway()
    const keys = await uncachedKeys(g, 12)
    // Every connection of the gateway's pool is busy for longer than a lookup waits for one (2 s).
    const release = await holdPool(g)
    const sent = performance.now()
    const connections = await sendAtOnce(g, keys.map(get))
    try {
      const { statuses } = answersOn(connections)
      await eventually(async () => statuses().length === 12, 15_000, 50)
      const millis = performance.now() - sent
      expect(statuses()).toEqual(connections.map(() => '503'))
      // 1 s of waiting, then the 2 s a lookup waits for a connection; in rounds of three, 8 s.
      expect(millis, 'the last answer').toBeLessThan(5_000)
    } finally {
      release()
      for (const connection of connections) connection.socket.destroy()
    }
  })

  // DESIGN: a malformed key is refused without touching Postgres or Redis; it can never succeed,
  // so this gateway's own count is enough to hold a flood of them back.
  it('counts missing and malformed keys in the gateway\'s memory: the fourth is 429, and Redis was never written', async () => {
    const g = await gateway()
    const gatewayPrefix = g.config.redis.keyPrefix
    const real = generateApiKey()
    const badChecksum = real.slice(0, -1) + (real.endsWith('0') ? '1' : '0')
    const attempts = [{}, { key: 'aas_not-a-real-key' }, { key: badChecksum }]
    for (const init of attempts) await (await g.request('/v1/pets', init)).arrayBuffer()
    const limited = await g.request('/v1/pets', { key: 'aas_not-a-real-key' })
    expect(expectRateLimitHeaders(limited, anonymous)).toMatchObject({ limit: 3, remaining: 0 })
    await expectTooManyRequests(limited)
    expect(await keyNames(`${gatewayPrefix}*`)).toEqual([])
  })

  it('charges Redis nothing for a guess the gateway\'s own count already refuses', async () => {
    const g = await gateway()
    const gatewayPrefix = g.config.redis.keyPrefix
    // Three requests without a key spend the address's count in this gateway, and touch no Redis.
    for (let i = 0; i < 3; i++) await expectErrorResponse(await g.request('/v1/pets'), 401, 'missing_api_key')
    for (let i = 0; i < 3; i++) await expectTooManyRequests(await g.request('/v1/pets', { key: generateApiKey() }))
    expect(await keyNames(`${gatewayPrefix}*`)).toEqual([])
  })

  it('counts guesses, well-formed keys looked up in vain, across gateways in Redis', async () => {
    const shared = `${prefix}shared:`
    const [one, two] = [await gateway([], shared), await gateway([], shared)]
    for (const g of [one, two, one]) await expectErrorResponse(await g.request('/v1/pets', { key: generateApiKey() }), 401, 'invalid_api_key')
    // The second gateway has seen one guess from this address; Redis has seen three.
    await expectTooManyRequests(await two!.request('/v1/pets', { key: generateApiKey() }))
    await expectTooManyRequests(await one!.request('/v1/pets', { key: generateApiKey() }))
    // A missing key is no guess: the second gateway's own count still has room for it.
    await expectErrorResponse(await two!.request('/v1/pets'), 401, 'missing_api_key')
  })

  it('counts a revoked or expired key like a guess, across gateways in Redis', async () => {
    const shared = `${prefix}expired:`
    const [one, two] = [await gateway([], shared), await gateway([], shared)]
    const { key } = await one!.createKey({ expiresAt: new Date(Date.now() - 60_000) })
    for (const g of [one, two, one]) await expectErrorResponse(await g!.request('/v1/pets', { key }), 401, 'invalid_api_key')
    // The second gateway has seen one of the three from this address; Redis has seen all three.
    await expectTooManyRequests(await two!.request('/v1/pets', { key }))
  })

  it('looks up only as many more keys as the limit for an address Redis says has spent the shared window', async () => {
    const shared = `${prefix}learnt:`
    const [one, two] = [await gateway([], shared), await gateway([], shared)]
    for (let i = 0; i < 3; i++) await expectErrorResponse(await one!.request('/v1/pets', { key: generateApiKey() }), 401, 'invalid_api_key')
    const lookups = two!.cache.stats.misses
    for (let i = 0; i < 20; i++) await expectTooManyRequests(await two!.request('/v1/pets', { key: generateApiKey() }))
    // One lookup to learn from Redis that the address has spent the window, then three.
    expect(two!.cache.stats.misses - lookups).toBe(4)
  })

  // DESIGN: Retry-After is never earlier than the moment a request would be admitted. Refused by
  // Redis while its own count is also spent, a gateway must name the later of the two resets.
  it('refuses a guess with a wait that outlasts both counts, Redis\'s and the gateway\'s own', async () => {
    const redis = new Redis(TEST_REDIS_URL, { keyPrefix: `${prefix}direct:` })
    try {
      const [one, two] = [1, 2].map(() => createAnonymousLimiter({ perMinute: 3, windowSeconds: 2, redis }))
      for (let i = 0; i < 3; i++) expect((await two!.consumeGuess('192.0.2.9')).admitted).toBe(true)
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      one!.consumeHere('192.0.2.9')
      one!.consumeHere('192.0.2.9')
      // Redis's window frees in about 1 s; this gateway's, now spent too, in about 2 s.
      const refused = await one!.consumeGuess('192.0.2.9')
      expect(refused).toMatchObject({ admitted: false, remaining: 0 })
      expect(refused.resetInMillis).toBeGreaterThan(1_500)
    } finally {
      redis.disconnect()
    }
  })

  // The mirror case: refused by its own count without asking Redis, a gateway that knows Redis's
  // window is spent for longer must name that reset, not its own earlier one.
  it('refuses a guess from its own count with a wait that outlasts a shared window it knows is spent for longer', async () => {
    const redis = new Redis(TEST_REDIS_URL, { keyPrefix: `${prefix}spent:` })
    try {
      const [one, two] = [1, 2].map(() => createAnonymousLimiter({ perMinute: 3, windowSeconds: 2, redis }))
      // This gateway's own window starts now (0–2 s) …
      one!.consumeHere('192.0.2.10')
      one!.consumeHere('192.0.2.10')
      await sleep(1_000)
      // … Redis's a second later (1–3 s), and its third guess here spends both.
      for (let i = 0; i < 2; i++) expect((await two!.consumeGuess('192.0.2.10')).admitted).toBe(true)
      expect((await one!.consumeGuess('192.0.2.10')).remaining).toBe(0)
      const refused = await one!.consumeGuess('192.0.2.10')
      expect(refused).toMatchObject({ admitted: false, remaining: 0 })
      // Its own count frees in about 1 s, Redis's in about 2 s.
      expect(refused.resetInMillis).toBeGreaterThan(1_500)
    } finally {
      redis.disconnect()
    }
  })

  // A reload that raises anonymous.perMinute: the address keeps what it spent, and has the room
  // the new limit leaves it at once, as a key does when its plan's limit is raised.
  it('answers a guess from an address that had spent the old limit once a reload raises it, not 429 until the old window ends', async () => {
    const redis = new Redis(TEST_REDIS_URL, { keyPrefix: `${prefix}raised:` })
    try {
      const before = createAnonymousLimiter({ perMinute: 2, windowSeconds: 60, redis })
      for (let i = 0; i < 2; i++) expect((await before.consumeGuess('192.0.2.11')).admitted).toBe(true)
      expect(await before.consumeGuess('192.0.2.11')).toMatchObject({ admitted: false, remaining: 0 })
      const raised = createAnonymousLimiter({ perMinute: 10, windowSeconds: 60, redis, replacing: before.counts })
      // Two guesses counted here and in Redis under the old limit (the refused one consumed nothing): seven left after this one.
      expect(await raised.consumeGuess('192.0.2.11')).toMatchObject({ admitted: true, limit: 10, remaining: 7 })
      // Its key lookups are not held back as an address past its limit either.
      expect(raised.beginLookUp('192.0.2.11').kind).toBe('go')
      // Lowered again, what it spent still refuses it.
      const lowered = createAnonymousLimiter({ perMinute: 3, windowSeconds: 60, redis, replacing: raised.counts })
      expect(await lowered.consumeGuess('192.0.2.11')).toMatchObject({ admitted: false, remaining: 0 })
    } finally {
      redis.disconnect()
    }
  })

  // The soak review: a key in use from an address that had also spent its limit and its lookups
  // on guesses was refused 429 each time its cache entry ran out (its TTL, every minute, or a
  // change to the key), until the address's window freed.
  it('looks up again, whatever the address has spent, a real key it held and dropped (its TTL, a change)', async () => {
    const g = await gateway()
    const [key] = await uncachedKeys(g, 1)
    expect((await g.request('/v1/pets', { key })).status).toBe(200)
    // The address spends its limit (3) and its lookups (3 more) on invented keys; the next is refused unlooked.
    for (let i = 0; i < 6; i++) await (await g.request('/v1/pets', { key: generateApiKey() })).arrayBuffer()
    const misses = g.cache.stats.misses
    await expectTooManyRequests(await g.request('/v1/pets', { key: generateApiKey() }))
    expect(g.cache.stats.misses, 'no lookup for the seventh guess').toBe(misses)
    // The key leaves the cache as its TTL or a change to it would make it.
    g.cache.invalidate(hashApiKey(key!))
    const response = await g.request('/v1/pets', { key })
    expect(response.status).toBe(200)
    expect(expectRateLimitHeaders(response, keyed).limit).toBe(100_000)
    expect(g.cache.stats.misses).toBe(misses + 1)
    // Guesses are still refused without a lookup.
    await expectTooManyRequests(await g.request('/v1/pets', { key: generateApiKey() }))
    expect(g.cache.stats.misses).toBe(misses + 1)
  })

  it('never charges a key: a valid key from the same, exhausted IP has its whole quota', async () => {
    const g = await gateway()
    const { key } = await g.createKey({ plan: 'free' })
    // A guess at a variant of the real key counts against the IP, not against the key.
    const variant = key.slice(0, -1) + (key.endsWith('a') ? 'b' : 'a')
    for (let i = 0; i < 3; i++) await (await g.request('/v1/pets', { key: variant })).arrayBuffer()
    await expectTooManyRequests(await g.request('/v1/pets', { key: variant }))
    const response = await g.request('/v1/pets', { key })
    expect(response.status).toBe(200)
    expect(expectRateLimitHeaders(response, keyed)).toMatchObject({ limit: 60, remaining: 59 })
    expect(expectRateLimitHeaders(response, keyed).current.get('day')?.r).toBe(999)
  })

  it('ignores X-Forwarded-For from a peer that is not a trusted proxy', async () => {
    const g = await gateway()
    const from = (address: string) => g.request('/v1/pets', { headers: { 'x-forwarded-for': address } })
    for (let i = 0; i < 3; i++) await expectErrorResponse(await from(`198.51.100.${i + 1}`), 401, 'missing_api_key')
    for (let i = 0; i < 3; i++) await expectTooManyRequests(await from(`198.51.100.${i + 10}`))
  })

  it('believes X-Forwarded-For from a trusted proxy: each client address has its own bucket', async () => {
    const g = await gateway(['127.0.0.1'])
    const from = (address: string) => g.request('/v1/pets', { headers: { 'x-forwarded-for': address } })
    for (let i = 0; i < 3; i++) await expectErrorResponse(await from('203.0.113.7'), 401, 'missing_api_key')
    await expectTooManyRequests(await from('203.0.113.7'))
    // A spoofed hop in front of the real client changes nothing: the proxy's view is the client.
    await expectTooManyRequests(await from('192.0.2.1, 203.0.113.7'))
    const other = await from('203.0.113.8')
    expect(expectRateLimitHeaders(other, anonymous)).toMatchObject({ status: 401, remaining: 2 })
    await other.arrayBuffer()
    // The proxy's own requests (no X-Forwarded-For) are one more client.
    const direct = await g.request('/v1/pets')
    expect(expectRateLimitHeaders(direct, anonymous)).toMatchObject({ status: 401, remaining: 2 })
  })

  it('counts one client under every spelling of its address, and an IPv6 client under its /64', async () => {
    const g = await gateway(['127.0.0.1'])
    const from = (address: string) => g.request('/v1/pets', { headers: { 'x-forwarded-for': address } })
    // With its source port too, as some load balancers write it: still one client, not one per connection.
    for (const spelling of ['203.0.113.9', '203.0.113.9:40123', '[::ffff:203.0.113.9]:443']) {
      await expectErrorResponse(await from(spelling), 401, 'missing_api_key')
    }
    await expectTooManyRequests(await from('203.0.113.9'))
    for (const address of ['2001:db8:1:2::1', '2001:DB8:1:2:0:0:0:2', '2001:db8:1:2:ffff::3']) {
      await expectErrorResponse(await from(address), 401, 'missing_api_key')
    }
    await expectTooManyRequests(await from('2001:db8:1:2:abcd::4'))
    // The next /64 is another subscriber.
    const neighbour = await from('2001:db8:1:3::1')
    expect(expectRateLimitHeaders(neighbour, anonymous)).toMatchObject({ status: 401, remaining: 2 })
    await neighbour.arrayBuffer()
  })

  it('finds the client behind a chain of trusted load balancers, one of which a later hop wrote with its source port', async () => {
    // Client → CDN (trusted 198.51.100.0/24) → a load balancer that writes its peer with the port → gateway.
    const g = await gateway(['127.0.0.1', '198.51.100.0/24'])
    const from = (forwardedFor: string) => g.request('/v1/pets', { headers: { 'x-forwarded-for': forwardedFor } })
    for (let port = 40_120; port < 40_123; port++) await expectErrorResponse(await from(`203.0.113.3, 198.51.100.8:${port}`), 401, 'missing_api_key')
    await expectTooManyRequests(await from('203.0.113.3, 198.51.100.8:40200'))
    // Another client behind the same CDN address has its own count, not the CDN's.
    const other = await from('203.0.113.4, 198.51.100.8:40201')
    expect(expectRateLimitHeaders(other, anonymous)).toMatchObject({ status: 401, remaining: 2 })
    await other.arrayBuffer()
  })
})
