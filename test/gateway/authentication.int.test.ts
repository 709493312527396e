import { describe, expect, it, vi } from 'vitest'
import { KEY_PREFIX, generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { expectErrorResponse } from '../helpers/assertions.ts'
import { startGateway } from '../helpers/gateway.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { freshDatabase, suiteDatabase } from '../helpers/testDatabase.ts'
import { sleep } from './rateLimit/httpLimits.ts'

describe('gateway authentication', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: pets.url }))
  const second = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: pets.url }))

  // RFC 6750 §3: error="invalid_token" once a bearer credential was sent; none without one, or for another scheme.
  async function expectUnauthorized(response: Response, code: string, sent: 'bearer' | 'other scheme' = 'bearer') {
    expect(response.headers.get('www-authenticate')).toBe(
      code === 'missing_api_key' || sent === 'other scheme'
        ? 'Bearer realm="animal-adoption-store"'
        : 'Bearer realm="animal-adoption-store", error="invalid_token"',
    )
    return expectErrorResponse(response, 401, code)
  }

  it('lets a valid key through to the catalogue', async () => {
    const { key } = await gateway.createKey()
    const response = await gateway.request('/v1/pets', { key })
    expect(response.status).toBe(200)
    expect(await response.json()).toEqual([])
    // The client's own data: no shared cache may keep it.
    expect(response.headers.get('cache-control')).toBe('no-store')
  })

  it('answers 401 missing_api_key without an Authorization header', async () => {
    await expectUnauthorized(await gateway.request('/v1/pets'), 'missing_api_key')
  })

  it('answers 401 missing_api_key for an empty bearer token', async () => {
    await expectUnauthorized(await gateway.request('/v1/pets', { headers: { authorization: 'Bearer ' } }), 'missing_api_key')
  })

  it('never reads a key from the query string', async () => {
    const { key } = await gateway.createKey()
    await expectUnauthorized(await gateway.request(`/v1/pets?api_key=${key}`), 'missing_api_key')
    await expectUnauthorized(await gateway.request(`/v1/pets?access_token=${key}`), 'missing_api_key')
  })

  it.each<[string, (key: string) => string, ('bearer' | 'other scheme')?]>([
    ['another scheme', (key: string) => `Basic ${Buffer.from(`${key}:`).toString('base64')}`, 'other scheme'],
    ['the key without a scheme', (key: string) => key, 'other scheme'],
    ['a token with a bad checksum', (key: string) => `Bearer ${key.slice(0, -1)}${key.endsWith('A') ? 'B' : 'A'}`],
    ['a truncated key', (key: string) => `Bearer ${key.slice(0, -3)}`],
    ['a key with a different prefix', (key: string) => `Bearer sk_${key.slice(KEY_PREFIX.length)}`],
    ['two tokens', (key: string) => `Bearer ${key} ${key}`],
    ['the key run into the scheme, no space between (so no bearer credential)', (key: string) => `Bearer${key}`, 'other scheme'],
    // Once a regular expression that took 0.4 s of the event loop over these 16,000 spaces.
    ['a token after 16,000 spaces, then another', (key: string) => `Bearer${' '.repeat(16_000)}${key} x`],
  ])('answers 401 invalid_api_key for %s', async (_case, header, sent = 'bearer') => {
    const { key } = await gateway.createKey()
    await expectUnauthorized(await gateway.request('/v1/pets', { headers: { authorization: header(key) } }), 'invalid_api_key', sent)
  })

  it.each([
    ['the key without "Bearer "', (key: string) => key],
    ['the key as a Basic credential', (key: string) => `Basic ${Buffer.from(`${key}:`).toString('base64')}`],
  ])('tells a client that sent %s how to send it, rather than that the key is not valid', async (_case, header) => {
    const { key } = await gateway.createKey()
    const response = await gateway.request('/v1/pets', { headers: { authorization: header(key) } })
    expect(response.status).toBe(401)
    expect(await response.json()).toEqual({
      code: 'invalid_api_key',
      message: 'Send your API key as "Authorization: Bearer <key>".',
      status: 401,
    })
  })

  it('answers a bearer key that is not valid with "The API key is not valid."', async () => {
    const response = await gateway.request('/v1/pets', { key: generateApiKey() })
    expect(await response.json()).toEqual({ code: 'invalid_api_key', message: 'The API key is not valid.', status: 401 })
  })

  it('answers 401 invalid_api_key for a well-formed key that was never issued', async () => {
    await expectUnauthorized(await gateway.request('/v1/pets', { key: generateApiKey() }), 'invalid_api_key')
  })

  it.each([
    ['a key of the wrong shape', () => 'aas_notakey'],
    ['a key of the right shape with a broken checksum', () => {
      const key = generateApiKey()
      return `${key.slice(0, -1)}${key.endsWith('A') ? 'B' : 'A'}`
    }],
  ])('refuses %s without asking Postgres', async (_case, token) => {
    const lookups = vi.spyOn(gateway.keys, 'findByHash')
    const response = await gateway.request('/v1/pets', { headers: { authorization: `Bearer ${token()}` } })
    await expectUnauthorized(response, 'invalid_api_key')
    expect(lookups).not.toHaveBeenCalled()
    lookups.mockRestore()
  })

  it('remembers unknown keys, so guessing the same key twice asks Postgres once', async () => {
    const lookups = vi.spyOn(gateway.keys, 'findByHash')
    const guess = generateApiKey()
    await gateway.request('/v1/pets', { key: guess })
    await gateway.request('/v1/pets', { key: guess })
    expect(lookups).toHaveBeenCalledTimes(1)
    lookups.mockRestore()
  })

  it('answers 401 invalid_api_key for an expired key', async () => {
    const { key } = await gateway.createKey({ expiresAt: new Date(Date.now() - 1_000) })
    await expectUnauthorized(await gateway.request('/v1/pets', { key }), 'invalid_api_key')
  })

  // Expiry is the database's: a gateway whose clock is off by ten minutes judges it the same.
  it('judges expiry by the database\'s clock, not a skewed gateway\'s: refuses an expired key and admits one with minutes left', async () => {
    const expired = await gateway.createKey({ expiresInMillis: 500 })
    const live = await gateway.createKey({ expiresInMillis: 300_000 })
    await sleep(1_500) // both creations announced, and the first key expired
    const realNow = Date.now
    try {
      Date.now = () => realNow() - 600_000
      await expectErrorResponse(await gateway.request('/v1/pets', { key: expired.key }), 401, 'invalid_api_key')
      Date.now = () => realNow() + 600_000
      expect((await gateway.request('/v1/pets', { key: live.key })).status).toBe(200)
    } finally {
      Date.now = realNow
    }
  })

  // The cache keeps a key's record for up to its TTL (60 s shipped): its expiry still takes effect on time.
  it('refuses a key the moment it expires, though its record is in the gateway\'s key cache', async () => {
    const { key } = await gateway.createKey({ expiresInMillis: 2_500 })
    const expiredBy = performance.now() + 2_500
    await gateway.announced(key) // so the lookup below is the one the cache keeps
    const before = await gateway.request('/v1/pets', { key })
    expect(before.status).toBe(200)
    await before.arrayBuffer()
    const misses = gateway.cache.stats.misses
    await sleep(expiredBy + 300 - performance.now())
    const response = await gateway.request('/v1/pets', { key })
    expect(gateway.cache.stats.misses, 'answered from the cache').toBe(misses)
    await expectUnauthorized(response, 'invalid_api_key')
  })

  // Every answer to an authenticated request is that client's own, not only a 200.
  it('marks every answer to an authenticated request no-store: 404, 501 and the upstream\'s own errors too', async () => {
    const { key } = await gateway.createKey()
    for (const path of ['/v1/pets/999999', '/v1/pets/abc', '/v1/store/orders', '/v1/nowhere']) {
      const response = await gateway.request(path, { key })
      expect(response.status, path).toBeGreaterThanOrEqual(400)
      expect(response.headers.get('cache-control'), path).toBe('no-store')
      await response.arrayBuffer()
    }
  })

  // A pet's name (`<script>…`) in a JSON answer, sniffed as HTML by a browser, would run.
  it('tells browsers not to sniff any answer as another type: 200 from the catalogue, 401, 404 and 501', async () => {
    const { key } = await gateway.createKey()
    for (const [path, withKey] of [['/v1/pets', true], ['/v1/pets', false], ['/v1/pets/999999', true], ['/v1/store/orders', true]] as const) {
      const response = await gateway.request(path, withKey ? { key } : {})
      expect(response.headers.get('x-content-type-options'), `${path} ${response.status}`).toBe('nosniff')
      await response.arrayBuffer()
    }
  })

  it('refuses a revoked key on every running gateway within 2 seconds', async () => {
    const { id, key } = await gateway.createKey()
    expect((await gateway.request('/v1/pets', { key })).status).toBe(200)
    expect((await second.request('/v1/pets', { key })).status).toBe(200)
    await gateway.keys.revoke(id)
    await vi.waitFor(
      async () => {
        expect((await gateway.request('/v1/pets', { key })).status).toBe(401)
        expect((await second.request('/v1/pets', { key })).status).toBe(401)
      },
      { timeout: 2_000, interval: 50 },
    )
  })

  it('sees a plan change on every running gateway within 2 seconds', async () => {
    const { id, key } = await gateway.createKey({ plan: 'free' })
    await second.request('/v1/pets', { key })
    expect((await second.cache.lookup(key))?.plan).toBe('free')
    await gateway.keys.setPlan(id, 'pro')
    await vi.waitFor(async () => expect((await second.cache.lookup(key))?.plan).toBe('pro'), { timeout: 2_000, interval: 50 })
  })

  it('authenticates unknown paths too, then answers 404 not_found', async () => {
    await expectUnauthorized(await gateway.request('/v1/nowhere'), 'missing_api_key')
    const { key } = await gateway.createKey()
    await expectErrorResponse(await gateway.request('/v1/nowhere', { key }), 404, 'not_found')
  })

  // Regression: the gateway parsed JSON bodies for its own routes, so these were 400 invalid JSON.
  it('answers a body of broken JSON on a path that does not exist, or does not take it, by the path: 404 or 405', async () => {
    const { key } = await gateway.createKey()
    const brokenJson = { method: 'POST', headers: { 'content-type': 'application/json' }, body: 'not json' }
    await expectErrorResponse(await gateway.request('/v1/nowhere', { key, ...brokenJson }), 404, 'not_found')
    const orders = await gateway.request('/v1/store/orders', { key, ...brokenJson })
    expect(orders.headers.get('allow')).toBe('GET, HEAD')
    await expectErrorResponse(orders, 405, 'method_not_allowed')
  })

  // Regression: a Content-Type that is no media type at all was refused with 415 before any route ran.
  it('answers a body whose Content-Type is no media type, on a path that does not exist or does not take it, by the path: 404 or 405', async () => {
    const { key } = await gateway.createKey()
    for (const contentType of ['bogus', 'application/json, text/plain']) {
      const noMediaType = { method: 'POST', headers: { 'content-type': contentType }, body: '{}' }
      await expectErrorResponse(await gateway.request('/v1/nowhere', { key, ...noMediaType }), 404, 'not_found')
      // A QUERY too: only a path an upstream answers reads its body (415 there).
      await expectErrorResponse(await gateway.request('/v1/nowhere', { key, ...noMediaType, method: 'QUERY' }), 404, 'not_found')
      const orders = await gateway.request('/v1/store/orders', { key, ...noMediaType })
      expect(orders.headers.get('allow'), contentType).toBe('GET, HEAD')
      expect(orders.headers.get('x-ratelimit-limit'), contentType).not.toBeNull()
      await expectErrorResponse(orders, 405, 'method_not_allowed')
      // The key is still asked for first.
      await expectUnauthorized(await gateway.request('/v1/nowhere', noMediaType), 'missing_api_key')
    }
  })

  it('answers GET /v1/store/orders with 501 not_implemented after authentication', async () => {
    await expectUnauthorized(await gateway.request('/v1/store/orders'), 'missing_api_key')
    const { key } = await gateway.createKey()
    await expectErrorResponse(await gateway.request('/v1/store/orders', { key }), 501, 'not_implemented')
  })
})

describe('gateway authentication while Postgres is unreachable', () => {
  const expectUnauthorizedBody = (response: Response) => expectErrorResponse(response, 401, 'missing_api_key')

  // README, Postgres down (gateway): Retry-After drawn from 3 to 7 s on each 503, so the clients
  // refused during the outage do not all come back in the same second.
  it('answers a key it cannot check 503 every time, with Retry-After spread over whole seconds from 3 to 7, charging nobody: not its IP\'s anonymous limit, not the key', async () => {
    const database = await freshDatabase()
    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const through = new URL(database.url)
    through.port = String(relay.port)
    const pets = await startPetsService(database.url)
    const gateway = await startGateway({
      databaseUrl: through.toString(),
      petsUrl: pets.url,
      configure: (file) => {
        file.anonymous.perMinute = 3
      },
    })
    try {
      // Issued but never used: no gateway has it cached, so its lookup needs Postgres.
      const { key } = await gateway.createKey({ plan: 'pro' })
      await relay.cut()
      const retryAfters = new Set<string>()
      for (let i = 0; i < 40; i++) {
        const response = await gateway.request('/v1/pets', { key })
        const retryAfter = response.headers.get('retry-after') ?? ''
        expect(retryAfter).toMatch(/^[3-7]$/)
        retryAfters.add(retryAfter)
        // The headers say what the 503 says: nothing before Retry-After. Nothing was counted.
        expect(response.headers.get('ratelimit')).toBe(`"anonymous";r=0;t=${retryAfter}`)
        await expectErrorResponse(response, 503, 'service_unavailable')
      }
      // 40 draws from five values: all equal with a chance of 5 in 5^40.
      expect(retryAfters.size).toBeGreaterThan(1)
      // The IP's anonymous limit (3) was not spent by the forty.
      const keyless = await gateway.request('/v1/pets')
      expect(keyless.headers.get('x-ratelimit-remaining')).toBe('2')
      await expectUnauthorizedBody(keyless)
      await relay.restore()
      const back = await gateway.request('/v1/pets', { key })
      expect(back.status).toBe(200)
      expect(back.headers.get('ratelimit-policy')).toMatch(/^"minute";q=\d+;w=60, "day";q=\d+;w=86400$/)
      await back.arrayBuffer()
    } finally {
      await gateway.close()
      await pets.close()
      await relay.close()
      await database.drop()
    }
  })
})
