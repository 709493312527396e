import net from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { refusingUpstream, scriptedUpstream, silentUpstream } from '../helpers/fakeUpstreams.ts'
import { startGateway, type RunningGateway } from '../helpers/gateway.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { captureLog } from '../helpers/logCapture.ts'
import { openRaw } from '../helpers/rawClient.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

describe('gateway logs', () => {
  const database = suiteDatabase()
  const gatewayLog = captureLog()
  const petsLog = captureLog()
  const pets = suiteService(() => startPetsService(database.url, { logStream: petsLog.stream }))
  const gateways: RunningGateway[] = []

  beforeAll(async () => {
    gateways.push(await startGateway({ databaseUrl: database.url, petsUrl: pets.url, logStream: gatewayLog.stream }))
  })
  afterAll(async () => {
    for (const gateway of gateways) await gateway.close()
  })

  it('write one line per request with request id, method, route, status, duration, key id, plan and the client\'s address', async () => {
    const gateway = gateways[0]!
    const { key, id } = await gateway.createKey({ plan: 'pro' })
    await gateway.request('/v1/pets', { key, headers: { 'x-request-id': 'log-line-1' } })
    // Without a key the address is all that says who sent it (a flood of 401s, key guessing).
    await gateway.request('/v1/pets', { headers: { 'x-request-id': 'log-line-2' } })
    const lines = gatewayLog.lines.map((line) => JSON.parse(line) as Record<string, unknown>)
    expect(lines.filter((line) => line.requestId === 'log-line-1')).toEqual([
      expect.objectContaining({
        method: 'GET',
        route: '/v1/pets',
        status: 200,
        durationMs: expect.any(Number),
        keyId: id,
        plan: 'pro',
        clientAddress: '127.0.0.1',
      }),
    ])
    const keyless = lines.filter((line) => line.requestId === 'log-line-2')
    expect(keyless).toEqual([expect.objectContaining({ status: 401, plan: 'anonymous', clientAddress: '127.0.0.1' })])
    expect(keyless[0]!.keyId).toBeUndefined()
  })

  it('name behind a trusted proxy the client it names, without the port it may add, as the per-IP limit counts it', async () => {
    const behindProxy = await startGateway({
      databaseUrl: database.url,
      petsUrl: pets.url,
      logStream: gatewayLog.stream,
      configure: (file) => void (file.server.trustedProxies = ['127.0.0.1']),
    })
    gateways.push(behindProxy)
    // A trusted hop that passes on the client's own text (here a key) does not get it logged.
    const { key } = await behindProxy.createKey()
    for (const [requestId, forwarded] of [
      ['log-proxied-v4', '203.0.113.9:4444'],
      ['log-proxied-v6', '[2001:db8::1]:443'],
      ['log-proxied-plain', '198.51.100.7'],
      ['log-proxied-text', key],
      ['log-proxied-text-after', `203.0.113.9, ${key}`],
    ]) {
      await behindProxy.request('/v1/pets', { headers: { 'x-request-id': requestId!, 'x-forwarded-for': forwarded! } })
    }
    expect(gatewayLog.lines.join('\n')).not.toContain(key.slice(4))
    const lines = gatewayLog.lines.map((line) => JSON.parse(line) as Record<string, unknown>)
    const addressOf = (requestId: string) => lines.filter((line) => line.requestId === requestId).map((line) => line.clientAddress)
    expect(addressOf('log-proxied-v4')).toEqual(['203.0.113.9'])
    expect(addressOf('log-proxied-v6')).toEqual(['2001:db8::1'])
    expect(addressOf('log-proxied-plain')).toEqual(['198.51.100.7'])
    expect(addressOf('log-proxied-text')).toEqual(['unknown'])
    expect(addressOf('log-proxied-text-after')).toEqual(['unknown'])
  })

  it('record a documented 501 in the access line only, while an upstream failure also gets a line with its cause', async () => {
    const gateway = gateways[0]!
    const { key } = await gateway.createKey()
    expect((await gateway.request('/v1/store/orders', { key, headers: { 'x-request-id': 'log-501' } })).status).toBe(501)
    const upstream = await refusingUpstream()
    const failing = await startGateway({ databaseUrl: database.url, petsUrl: upstream.url, logStream: gatewayLog.stream })
    gateways.push(failing)
    expect((await failing.request('/v1/pets', { key, headers: { 'x-request-id': 'log-502' } })).status).toBe(502)
    await upstream.close()

    const lines = gatewayLog.lines.map((line) => JSON.parse(line) as Record<string, unknown>)
    const levels = (requestId: string) => lines.filter((line) => line.requestId === requestId).map((line) => [line.level, line.status ?? line.msg])
    expect(levels('log-501')).toEqual([[30, 501]])
    expect(levels('log-502')).toEqual([[40, 'upstream request failed'], [30, 502]])
    const failure = lines.find((line) => line.requestId === 'log-502' && line.level === 40)
    expect(failure).toMatchObject({ upstream: 'pets', code: 'bad_gateway', err: { message: expect.any(String) } })
    // Its cause, not the HTTP client's frames: the same 1 KB on every line an outage writes.
    expect((failure?.err as { stack: string }).stack).not.toMatch(/\n\s+at /)
    expect(JSON.stringify(failure).length).toBeLessThan(600)
  })

  it('write a line (status 499) and count the request when the client leaves before its answer', async () => {
    const upstream = await scriptedUpstream(() => undefined)
    const slow = await startGateway({ databaseUrl: database.url, petsUrl: upstream.url, logStream: gatewayLog.stream })
    gateways.push(slow)
    const { key, id } = await slow.createKey()
    const client = await openRaw(slow.url)
    client.socket.write(`GET /v1/pets HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ${key}\r\nX-Request-Id: log-aborted\r\n\r\n`)
    // Gone while the upstream has it: its key is known by then (a client gone during the lookup has none).
    await vi.waitFor(() => expect(upstream.requests).toHaveLength(1), { timeout: 10_000 })
    client.socket.destroy()
    const lines = () => gatewayLog.entries().filter((line) => line.requestId === 'log-aborted')
    await vi.waitFor(() => expect(lines()).not.toEqual([]), { timeout: 10_000 })
    await upstream.close()

    expect(lines()).toEqual([
      expect.objectContaining({ msg: 'request aborted by the client', route: '/v1/pets', status: 499, keyId: id, durationMs: expect.any(Number) }),
    ])
    expect(await slow.registry.metrics()).toMatch(/http_requests_total\{method="GET",route="\/v1\/pets",status_class="4xx",plan="free"\} 1\n/)
  })

  // Regression: a socket closed before any stage read the client's address has none (Node keeps it
  // only once read), and the forward's X-Forwarded-For failed on it: an error line with a stack
  // (internal_error) for ordinary client behaviour, 20,000 in a review's 3.5 minutes of aborts.
  it('write only the 499 line, no internal error, when the client leaves while its rate-limit decision is under way', async () => {
    const gateway = gateways[0]!
    const { key } = await gateway.createKey({ plan: 'pro' })
    expect((await gateway.request('/v1/pets', { key })).status).toBe(200)
    const store = gateway.limiter.store
    const consume = store.consume.bind(store)
    let clientGone = () => undefined as void
    const gone = new Promise<void>((resolve) => (clientGone = resolve))
    let decided: ReturnType<typeof consume> | undefined
    // Redis answers only once the client has left.
    store.consume = (request) => (decided = gone.then(() => consume(request)))
    try {
      const client = await openRaw(gateway.url)
      client.socket.write(`GET /v1/pets HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ${key}\r\nX-Request-Id: log-gone-early\r\n\r\n`)
      await vi.waitFor(() => expect(decided).toBeDefined())
      client.socket.destroy()
      await client.closed
      await sleep(50)
      clientGone()
      await decided
      await sleep(100)
    } finally {
      store.consume = consume
    }
    const lines = gatewayLog.entries().filter((line) => line.requestId === 'log-gone-early')
    expect(lines.map((line) => [line.level, line.msg, line.status])).toEqual([[30, 'request aborted by the client', 499]])
  })

  it('write a warning and an answer-cut-short line (not a client abort) when the upstream breaks off an answer under way', async () => {
    const upstream = await scriptedUpstream((_request, response) => {
      response.writeHead(200, { 'transfer-encoding': 'chunked' })
      response.write('first part')
      setTimeout(() => response.socket?.destroy(), 100)
    })
    const breaking = await startGateway({ databaseUrl: database.url, petsUrl: upstream.url, logStream: gatewayLog.stream })
    gateways.push(breaking)
    const { key } = await breaking.createKey()
    const response = await breaking.request('/v1/pets', { key, headers: { 'x-request-id': 'log-broken-off' }, contract: false })
    expect(response.status).toBe(200)
    await expect(response.text()).rejects.toThrow()
    await sleep(200)
    await upstream.close()

    const lines = gatewayLog.entries().filter((line) => line.requestId === 'log-broken-off')
    expect(lines.map((line) => [line.level, line.msg, line.status])).toEqual([
      [40, 'upstream answer broken off after its head was sent', undefined],
      [30, 'answer cut short', 200],
    ])
  })

  it('write only the parser refusal line, and count the request once with its 400, when its body never came whole', async () => {
    const gateway = gateways[0]!
    const counted = async () => {
      const metric = await gateway.registry.getSingleMetric('http_requests_total')!.get()
      const series = metric.values.find((value) => value.labels.method === 'POST' && value.labels.route === '/v1/pets' && value.labels.status_class === '4xx')
      return series?.value ?? 0
    }
    const countedBefore = await counted()
    const before = gatewayLog.lines.length
    const client = await openRaw(gateway.url)
    client.socket.write('POST /v1/pets HTTP/1.1\r\nHost: test\r\nX-Request-Id: log-broken-chunk\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n')
    await client.closed
    await sleep(200)
    const lines = gatewayLog.entries().slice(before)
    expect(lines.map((line) => [line.msg, line.status])).toEqual([['request refused by the HTTP parser', 400]])
    expect(await counted()).toBe(countedBefore + 1)
  })

  it('write a line for a request the HTTP parser refused before it became one (431)', async () => {
    const { port } = new URL(gateways[0]!.url)
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(Number(port), '127.0.0.1', () => socket.write(`GET /v1/pets HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`))
      let text = ''
      socket.setEncoding('utf8')
      socket.on('data', (chunk: string) => (text += chunk))
      socket.on('close', () => resolve(text))
      socket.on('error', reject)
    })
    expect(answer).toMatch(/^HTTP\/1.1 431 /)
    const lines = gatewayLog.lines.map((line) => JSON.parse(line) as Record<string, unknown>)
    expect(lines).toContainEqual(
      expect.objectContaining({ level: 30, status: 431, code: 'headers_too_large', reason: 'HPE_HEADER_OVERFLOW', msg: 'request refused by the HTTP parser' }),
    )
  })

  it('write a line for a method the HTTP parser does not know, and for CONNECT (501)', async () => {
    const { port } = new URL(gateways[0]!.url)
    for (const request of ['FOO /v1/pets HTTP/1.1\r\nHost: x\r\n\r\n', 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n']) {
      const before = gatewayLog.lines.length
      const answer = await new Promise<string>((resolve, reject) => {
        const socket = net.connect(Number(port), '127.0.0.1', () => socket.write(request))
        let text = ''
        socket.setEncoding('utf8')
        socket.on('data', (chunk: string) => (text += chunk))
        socket.on('close', () => resolve(text))
        socket.on('error', reject)
      })
      expect(answer).toMatch(/^HTTP\/1.1 501 /)
      await sleep(200)
      const lines = gatewayLog.lines.slice(before).map((line) => JSON.parse(line) as Record<string, unknown>)
      expect(lines, request).toContainEqual(expect.objectContaining({ level: 30, status: 501, code: 'not_implemented', reason: expect.any(String), remoteAddress: expect.any(String) }))
    }
  })

  it('never contain a key, on any path: success, 401, 404, upstream failures', async () => {
    const gateway = gateways[0]!
    const { key: valid } = await gateway.createKey()
    const { key: revoked, id: revokedId } = await gateway.createKey()
    await gateway.keys.revoke(revokedId)
    const unknown = generateApiKey()
    const malformed = `${valid.slice(0, -2)}zz`
    const sent = [valid, revoked, unknown, malformed]
    const json = { method: 'POST', headers: { 'content-type': 'application/json' } }

    for (const key of sent) {
      await gateway.request('/v1/pets', { key })
      await gateway.request('/v1/pets', { key, ...json, body: '{"name":"Rex","categoryId":1}' })
      await gateway.request('/v1/pets', { key, ...json, body: '{"broken' })
      await gateway.request('/v1/pets/12345', { key })
      await gateway.request('/v1/nowhere', { key })
      await gateway.request('/v1/store/orders', { key })
      await gateway.request(`/v1/pets?api_key=${key}`)
    }
    for (const upstream of [await refusingUpstream(), await silentUpstream()]) {
      const failing = await startGateway({
        databaseUrl: database.url,
        petsUrl: upstream.url,
        logStream: gatewayLog.stream,
        configure: (file) => {
          file.upstreams.pets.timeoutSeconds = 0.3
        },
      })
      gateways.push(failing)
      expect((await failing.request('/v1/pets', { key: valid })).status).toBeGreaterThanOrEqual(502)
      await upstream.close()
    }

    const everything = [...gatewayLog.lines, ...petsLog.lines].join('\n')
    expect(gatewayLog.lines.length).toBeGreaterThan(30)
    expect(everything).toContain('upstream request failed')
    for (const key of sent) {
      expect(everything).not.toContain(key)
      // Nor the random body alone, in case something strips the prefix.
      expect(everything).not.toContain(key.slice(4, 30))
    }
  })
})
