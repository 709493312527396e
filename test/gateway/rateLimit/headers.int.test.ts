import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { generateApiKey } from '../../../gateway/src/keys/apiKeyFormat.ts'
import { refusingUpstream, silentUpstream, type TestUpstream } from '../../helpers/fakeUpstreams.ts'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../../helpers/redis.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, anonymous, expectRateLimitHeaders, expectTooManyRequests, keyed } from './httpLimits.ts'

const json = (body: unknown) => ({ method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

/** An upstream that answers 200 with its own (forged) rate-limit headers. */
async function forgingUpstream(): Promise<TestUpstream> {
  const server = http.createServer((_request, response) => {
    response.writeHead(200, {
      'content-type': 'application/json',
      'x-ratelimit-limit': '999999',
      'x-ratelimit-remaining': '-5',
      'x-ratelimit-reset': '0',
      'ratelimit-policy': '"upstream";q=1;w=1',
      ratelimit: '"upstream";r=1;t=1',
    })
    response.end('[]')
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}

describe('rate-limit headers on every /v1 answer, whoever produced it', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  let pets: RunningPetsService
  const upstreams: TestUpstream[] = []
  const gateways: RunningGateway[] = []
  let gateway: RunningGateway
  let key: string

  async function gatewayTo(petsUrl: string, timeoutSeconds = 10): Promise<RunningGateway> {
    const started = await startGateway({
      databaseUrl: database.url,
      petsUrl,
      env: { REDIS_URL: TEST_REDIS_URL },
      configure: (file) => {
        file.redis.keyPrefix = prefix
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
        file.upstreams.pets.timeoutSeconds = timeoutSeconds
      },
    })
    gateways.push(started)
    return started
  }

  beforeAll(async () => {
    pets = await startPetsService(database.url)
    gateway = await gatewayTo(pets.url)
    ;({ key } = await gateway.createKey({ plan: 'enterprise', perMinute: 10_000, perDay: 100_000 }))
  })
  afterAll(async () => {
    for (const started of gateways) await started.close()
    for (const upstream of upstreams) await upstream.close()
    await pets?.close()
  })

  it('200, 201, 400, 404 and 405 from the pets-service carry both windows', async () => {
    const cases: [Promise<Response>, number][] = [
      [gateway.request('/v1/pets', { key }), 200],
      [gateway.request('/v1/pets', { key, ...json({ name: 'Rex', categoryId: 1 }) }), 201],
      [gateway.request('/v1/pets', { key, ...json({ name: '', categoryId: 1 }) }), 400],
      [gateway.request('/v1/pets/999999', { key }), 404],
      [gateway.request('/v1/pets/1', { key, method: 'DELETE' }), 405],
    ]
    for (const [pending, status] of cases) {
      const response = await pending
      expect(response.status).toBe(status)
      const view = expectRateLimitHeaders(response, keyed)
      expect(view.policy.get('minute')).toEqual({ q: 10_000, w: 60 })
      expect(view.policy.get('day')).toEqual({ q: 100_000, w: 86_400 })
      expect(view.limit).toBe(10_000)
      expect(view.retryAfter).toBeUndefined()
    }
  })

  it('404, 405, 413 and 501 answered by the gateway itself carry both windows', async () => {
    const notFound = await gateway.request('/v1/no-such-route', { key })
    expect(notFound.status).toBe(404)
    expectRateLimitHeaders(notFound, keyed)
    const notAllowed = await gateway.request('/v1/store/orders', { key, method: 'DELETE' })
    expect(notAllowed.status).toBe(405)
    expectRateLimitHeaders(notAllowed, keyed)
    const tooLarge = await gateway.request('/v1/pets', {
      key,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: 'x'.repeat(1_048_577),
    })
    expect(tooLarge.status).toBe(413)
    expectRateLimitHeaders(tooLarge, keyed)
    const orders = await gateway.request('/v1/store/orders', { key })
    expect(orders.status).toBe(501)
    expectRateLimitHeaders(orders, keyed)
  })

  it('400 for a path that does not percent-decode is answered after the key check, with both windows', async () => {
    for (const path of ['/v1/pets/%zz', '/v1/pets/%C3%28', '/v1/%']) {
      const response = await gateway.request(path, { key })
      expect(response.status, path).toBe(400)
      expect(await response.json()).toMatchObject({ code: 'bad_request', status: 400 })
      expect(response.headers.get('x-request-id')).toBeTruthy()
      expectRateLimitHeaders(response, keyed)
    }
    const withoutKey = await gateway.request('/v1/pets/%zz')
    expect(withoutKey.status).toBe(401)
    expectRateLimitHeaders(withoutKey, anonymous)
  })

  it('401 for a missing, malformed or unknown key carries the anonymous window', async () => {
    const unknownKey = generateApiKey()
    for (const init of [{}, { key: 'not-a-key' }, { key: unknownKey }, { headers: { authorization: 'Basic abc' } }]) {
      const response = await gateway.request('/v1/pets', init)
      expect(response.status).toBe(401)
      const view = expectRateLimitHeaders(response, anonymous)
      expect(view.policy.get('anonymous')).toEqual({ q: 100_000, w: 60 })
    }
  })

  it('429 carries both windows, Retry-After in whole seconds and the rate_limited body', async () => {
    const { key: tiny } = await gateway.createKey({ plan: 'enterprise', perMinute: 1, perDay: 1_000 })
    expect((await gateway.request('/v1/store/orders', { key: tiny })).status).toBe(501)
    const limited = await gateway.request('/v1/pets', { key: tiny })
    const view = expectRateLimitHeaders(limited, keyed)
    expect(view).toMatchObject({ status: 429, limit: 1, remaining: 0 })
    expect(view.current.get('day')?.r).toBe(999)
    const retryAfter = await expectTooManyRequests(limited, 'rate_limited')
    expect(retryAfter).toBeLessThanOrEqual(65)
  })

  it('502 and 504 from a failing upstream carry both windows', async () => {
    const refusing = await refusingUpstream()
    const silent = await silentUpstream()
    upstreams.push(refusing, silent)
    const badGateway = await (await gatewayTo(refusing.url)).request('/v1/pets', { key })
    expect(badGateway.status).toBe(502)
    expectRateLimitHeaders(badGateway, keyed)
    const timeout = await (await gatewayTo(silent.url, 0.5)).request('/v1/pets', { key })
    expect(timeout.status).toBe(504)
    expectRateLimitHeaders(timeout, keyed)
  })

  // RateLimit's t counts seconds from the answer; computed at the decision, it overstated the
  // wait by the upstream's whole latency (here 2.5 s, 10 s for a default 504).
  it('a late answer (a 504 after 2.5 s) gives RateLimit t from when it is sent, in step with X-RateLimit-Reset', async () => {
    const silent = await silentUpstream()
    upstreams.push(silent)
    const timeout = await (await gatewayTo(silent.url, 2.5)).request('/v1/pets', { key })
    const receivedSeconds = Date.now() / 1_000
    expect(timeout.status).toBe(504)
    const view = expectRateLimitHeaders(timeout, keyed)
    // The X-RateLimit-* window is the minute here (fewer left than the day).
    const t = view.current.get('minute')!.t
    expect(Math.abs(view.reset - receivedSeconds - t), `t=${t}, reset in ${(view.reset - receivedSeconds).toFixed(2)} s`).toBeLessThanOrEqual(1.2)
  })

  it("replaces an upstream's own rate-limit headers with the gateway's", async () => {
    const forging = await forgingUpstream()
    upstreams.push(forging)
    const response = await (await gatewayTo(forging.url)).request('/v1/pets', { key })
    expect(response.status).toBe(200)
    const view = expectRateLimitHeaders(response, keyed)
    expect(view.limit).toBe(10_000)
    expect(response.headers.get('x-ratelimit-remaining')).not.toBe('-5')
  })

  it('the counters all answers report are shared: one key, one count, across statuses', async () => {
    const { key: fresh } = await gateway.createKey({ plan: 'enterprise', perMinute: 50, perDay: 1_000 })
    const remaining: number[] = []
    for (const path of ['/v1/pets', '/v1/pets/999999', '/v1/store/orders', '/v1/nowhere']) {
      remaining.push(expectRateLimitHeaders(await gateway.request(path, { key: fresh }), keyed).remaining)
    }
    expect(remaining).toEqual([49, 48, 47, 46])
  })
})
