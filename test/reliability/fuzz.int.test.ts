import net from 'node:net'
import fc from 'fast-check'
import { beforeAll, describe, expect, it } from 'vitest'
import { startGateway } from '../helpers/gateway.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/** Every status the system documents; anything else is a defect. */
const DOCUMENTED = new Set([200, 201, 400, 401, 404, 405, 408, 413, 415, 422, 429, 431, 501, 502, 503, 504])

interface RawAnswer {
  status: number
  headers: string
  body: string
}

/**
 * One request as raw bytes (so CR/LF, NUL and invalid UTF-8 reach the server as sent). The
 * request says `Connection: close`, so the server closes once it has answered; `halfClose`
 * also ends our side at once, as a client does that sends a short body and gives up.
 */
function send(url: string, bytes: Buffer, halfClose = false): Promise<RawAnswer> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    const socket = net.connect(Number(port), hostname, () => (halfClose ? socket.end(bytes) : socket.write(bytes)))
    socket.on('data', (chunk: Buffer) => chunks.push(chunk))
    socket.on('error', reject)
    socket.setTimeout(5_000, () => socket.destroy(new Error('hang: no answer within 5 s')))
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('latin1')
      const split = text.indexOf('\r\n\r\n')
      const head = split === -1 ? text : text.slice(0, split)
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0)
      resolve({ status, headers: head, body: split === -1 ? '' : text.slice(split + 4) })
    })
  })
}

/** The first answer's body, chunked or sized (a second answer may follow on the connection). */
function bodyOf(answer: RawAnswer): string {
  const length = /content-length: (\d+)/i.exec(answer.headers)?.[1]
  if (length !== undefined) return answer.body.slice(0, Number(length))
  if (!/transfer-encoding: chunked/i.test(answer.headers)) return answer.body
  let rest = answer.body
  let out = ''
  for (;;) {
    const end = rest.indexOf('\r\n')
    const size = parseInt(rest.slice(0, end), 16)
    if (!size) return out
    out += rest.slice(end + 2, end + 2 + size)
    rest = rest.slice(end + 2 + size + 2)
  }
}

describe('the gateway under hostile input', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: pets.url }))
  let key: string

  beforeAll(async () => {
    ;({ key } = await gateway.createKey({ plan: 'enterprise', perMinute: 1_000_000, perDay: 1_000_000_000 }))
  })

  const segment = fc.oneof(
    fc.constantFrom('v1', 'pets', 'store', 'orders', '..', '.', '%2e%2e', '%2F', '%00', '%ff', '%', '1', '-1', '9'.repeat(30), '__proto__'),
    fc.string({ maxLength: 12 }).map(encodeURIComponent),
  )
  const path = fc.array(segment, { minLength: 1, maxLength: 5 }).map((parts) => `/${parts.join('/')}`)
  const pathsUnderV1 = fc.oneof(path, path.map((p) => `/v1${p}`), fc.constantFrom('/v1/pets', '/v1/pets/1', '/v1/store/orders'))
  const query = fc.oneof(
    fc.constant(''),
    fc
      .array(fc.tuple(fc.constantFrom('limit', 'status', 'cursor', 'api_key', '__proto__', 'x'), fc.string({ maxLength: 20 })), { maxLength: 4 })
      .map((pairs) => `?${pairs.map(([k, v]) => `${k}=${encodeURIComponent(v)}`).join('&')}`),
    fc.constantFrom('?limit=1&limit=2', '?%', '?limit=%ff', '?status[]=sold', '?a=\u0000'),
  )
  const body = fc.oneof(
    fc.constant(''),
    fc.json().map((text) => Buffer.from(text)),
    fc.constantFrom(
      '{"name":"Rex","categoryId":1}',
      '{"__proto__":{"x":1},"name":"a","categoryId":1}',
      '{"constructor":{"prototype":{"x":1}},"name":"a","categoryId":1}',
      '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]',
      '{"name":"Re\\u0000x","categoryId":1}',
      '{"name":',
    ),
    fc.uint8Array({ maxLength: 64 }).map((bytes) => Buffer.from(bytes)),
  )
  const headerValue = fc.oneof(
    fc.string({ maxLength: 30 }).filter((value) => !/[\r\n]/.test(value)),
    fc.constantFrom('Bearer ', 'Bearer aas_x', 'Basic abc', '\u00ff\u00fe', 'a\u0000b'),
  )
  const contentType = fc.constantFrom(undefined, 'application/json', 'text/plain', 'application/json; charset=latin1', 'multipart/form-data; boundary=x')

  function request(method: string, target: string, headers: [string, string][], payload: Buffer | string): Buffer {
    const bytes = typeof payload === 'string' ? Buffer.from(payload) : payload
    const lines = [`${method} ${target} HTTP/1.1`, 'Host: 127.0.0.1', 'Connection: close', ...headers.map(([name, value]) => `${name}: ${value}`)]
    if (bytes.length > 0 || method === 'POST') lines.push(`Content-Length: ${bytes.length}`)
    return Buffer.concat([Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1'), bytes])
  }

  it('never crashes, hangs, answers an undocumented status, or leaves the Error body out', async () => {
    const statuses = new Map<number, number>()
    let slowest = 0
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'),
        pathsUnderV1,
        query,
        fc.boolean(),
        contentType,
        fc.array(fc.tuple(fc.constantFrom('X-Internal-Token', 'X-Consumer-Id', 'X-Forwarded-For', 'Idempotency-Key', 'Accept', 'X-Request-Id'), headerValue), { maxLength: 3 }),
        body,
        async (method, target, search, authorised, type, extra, payload) => {
          const headers: [string, string][] = [...extra]
          if (authorised) headers.push(['Authorization', `Bearer ${key}`])
          if (type) headers.push(['Content-Type', type])
          const started = performance.now()
          const answer = await send(gateway.url, request(method, `${target}${search}`, headers, payload))
          slowest = Math.max(slowest, performance.now() - started)
          statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1)
          expect(DOCUMENTED, `${method} ${target}${search} answered ${answer.status}`).toContain(answer.status)
          // 5xx only for the one documented server answer that is not a fault.
          if (answer.status >= 500) expect(answer.status).toBe(501)
          if (answer.status >= 400 && method !== 'HEAD') {
            let error: Record<string, unknown>
            try {
              error = JSON.parse(bodyOf(answer)) as Record<string, unknown>
            } catch {
              throw new Error(`not an Error body: ${JSON.stringify(answer)}`)
            }
            expect(error).toEqual({ code: expect.any(String), message: expect.any(String), status: answer.status })
            expect(JSON.stringify(error)).not.toMatch(/\bat .+\.ts:\d+|SELECT |node_modules/)
          }
        },
      ),
      { numRuns: 300 },
    )
    // And it still serves.
    expect((await gateway.request('/v1/pets', { key })).status).toBe(200)
    const runs = [...statuses.values()].reduce((sum, count) => sum + count, 0)
    recordScenario({
      area: 'Hostile input',
      scenario: 'Random raw requests through the gateway: methods, paths, queries, headers and bodies (fast-check)',
      answered: `${runs} requests, statuses ${[...statuses].sort(([a], [b]) => a - b).map(([status, count]) => `${status} ×${count}`).join(', ')}, every 4xx/5xx an Error body; slowest ${Math.round(slowest)} ms`,
      lost: 'nothing: no crash, hang or undocumented status, and the gateway answered 200 to a valid key afterwards',
      test: 'test/reliability/fuzz.int.test.ts',
    })
  })

  it.each([
    ['CR/LF in a header value', 'GET /v1/pets HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n'],
    ['NUL in the path', 'GET /v1/pe\u0000ts HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['a space in the path', 'GET /v1/pe ts HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['non-UTF-8 bytes in the path', 'GET /v1/\u00ff\u00fe HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['a body that ends early', 'POST /v1/pets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"name":'],
    ['two Content-Length headers', 'POST /v1/pets HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}'],
  ])('answers %s with a documented 4xx Error body, or closes', async (rawCase, bytes) => {
    const answer = await send(gateway.url, Buffer.from(bytes, 'latin1'), true)
    const still = async () => expect((await gateway.request('/v1/pets', { key })).status).toBe(200)
    if (answer.status === 0) {
      // The client closed first (the early-ending body): nothing to answer.
      await still()
      recordScenario({
        area: 'Hostile input',
        scenario: `A raw request with ${rawCase}`,
        answered: 'the connection closed once the client gave up; no answer was due',
        lost: 'nothing: the gateway answered the next request 200',
        test: 'test/reliability/fuzz.int.test.ts',
      })
      return
    }
    expect([400, 401, 404, 408, 413]).toContain(answer.status)
    const error = JSON.parse(bodyOf(answer)) as { code: string }
    expect(error).toEqual({ code: expect.any(String), message: expect.any(String), status: answer.status })
    await still()
    recordScenario({
      area: 'Hostile input',
      scenario: `A raw request with ${rawCase}`,
      answered: `${answer.status} ${error.code} with the Error body`,
      lost: 'nothing: the gateway answered the next request 200',
      test: 'test/reliability/fuzz.int.test.ts',
    })
  })
})
