/**
 * Differential check of the gateway's proxy stage: the same raw requests (every method, odd paths,
 * bodies, forged and Connection-named headers, client aborts) through gateway/src/proxy/
 * upstreamProxy.ts and through another stage, each against a raw upstream with scripted answers.
 * Compares byte for byte what the upstream received, what the client got (ports and dates
 * normalised) and the metrics observer's events.
 *
 * The other stage is the one before tuning (bench/experiments/upstreamProxyReplyFrom.ts), or with
 * `--before FILE` any module exporting `upstreamProxy`, e.g. the file at an earlier commit, to check
 * that a change to the stage changes nothing:
 *
 *   git show HEAD~1:gateway/src/proxy/upstreamProxy.ts > gateway/src/proxy/upstreamProxy.before.ts
 *   npx tsx bench/tools/proxyParity.ts --before gateway/src/proxy/upstreamProxy.before.ts
 *
 * Usage: npx tsx bench/tools/proxyParity.ts [--before FILE] [--show NAME]
 * Exit 0 when the only differences are the known, intended ones (against reply-from:
 * KNOWN_DIFFERENCES, and the upstream request's header order and Via), else 1.
 */
import net from 'node:net'
import { parseArgs } from 'node:util'
import Fastify, { type FastifyInstance } from 'fastify'
import { errorBodies } from '../../common/src/http/errorHandler.ts'
import { gatewayFrameworkErrors } from '../../gateway/src/errors.ts'
import { DEFAULT_MAX_IN_FLIGHT } from '../../gateway/src/config/loadConfig.ts'
import { upstreamProxy as tuned, type UpstreamOptions } from '../../gateway/src/proxy/upstreamProxy.ts'
import { pathToFileURL } from 'node:url'

/**
 * Upstream failures after the status line: reply-from streamed the answer and so leaked them (a
 * truncated 200, or 500 internal_error when nothing had been written yet); the tuned stage
 * collects sized answers first and maps them like every other upstream failure (502/504). And a
 * request whose Connection header names Keep-Alive or Upgrade: reply-from forwarded them, undici
 * refused to send them, and the client got 502; the tuned stage drops them (hop by hop) and sends it.
 */
const KNOWN_DIFFERENCES = new Set(['scenario status600', 'scenario truncated', 'scenario slowbody', 'scenario head', 'connection named'])

const { values } = parseArgs({ options: { show: { type: 'string', multiple: true, default: [] }, before: { type: 'string' } } })
const againstReplyFrom = values.before === undefined
const original = (
  (await import(againstReplyFrom ? '../experiments/upstreamProxyReplyFrom.ts' : pathToFileURL(values.before!).href)) as { upstreamProxy: typeof tuned }
).upstreamProxy

/**
 * Against reply-from, the upstream request's header lines in order, without the gateway's Via: the
 * tuned stage sends the gateway's own headers first (a client's thousand headers must not push them
 * past the upstream's header limit) and a Via (RFC 9110 §7.6.3), both on purpose.
 */
const comparableUpstream = (requests: string[]) =>
  againstReplyFrom
    ? requests.map((text) => {
        const [head = '', ...body] = text.split('\r\n\r\n')
        const [line, ...fields] = head.split('\r\n')
        const kept = fields.filter((field) => field !== 'via: 1.1 aas-gateway').map((field) => field.replace(/^(via: .*), 1\.1 aas-gateway$/, '$1'))
        return [[line, ...kept.sort()].join('\r\n'), ...body].join('\r\n\r\n')
      })
    : requests
const seen: string[] = []

const big = 'x'.repeat(2 * 1024 * 1024)
const answers: Record<string, (socket: net.Socket) => void> = {
  json: (s) => s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 11\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Obs: caf\xe9\r\nX-RateLimit-Remaining: -5\r\nLocation: /pets/1\r\nLink: </v1/pets?cursor=x>; rel="next"\r\n\r\n{"ok":true}', 'latin1'),
  nocontenttype: (s) => s.write('HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc'),
  chunked: (s) => s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n\r\n'),
  nocontent: (s) => s.write('HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n'),
  notmodified: (s) => s.write('HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'),
  big: (s) => s.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${big.length}\r\n\r\n${big}`),
  status600: (s) => s.write('HTTP/1.1 600 Weird\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi'),
  close: (s) => s.end('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi'),
  error404: (s) => {
    const body = '{"code":"pet_not_found","message":"No such pet","status":404}'
    s.write(`HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${body.length}\r\n\r\n${body}`)
  },
  garbage: (s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\x00\x01 broken\r\n\r\n'),
  truncated: (s) => { s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n0123456789'); setTimeout(() => s.destroy(), 50) },
  slowbody: (s) => { s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nab'); setTimeout(() => s.end('cd'), 1_500) },
  silent: () => undefined,
  head: (s) => s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n'),
  hop: (s) => s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: X-Secret, keep-alive\r\nX-Secret: s\r\nProxy-Connection: x\r\nTrailer: y\r\nUpgrade: h2\r\nX-Dup: 1\r\nX-Dup: 2\r\nWWW-Authenticate: a\r\nWWW-Authenticate: b\r\n\r\nok'),
  twoconnection: (s) => s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: X-A\r\nConnection: keep-alive\r\nX-A: 1\r\n\r\nok'),
  late: (s) => { setTimeout(() => s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok'), 300) },
  latestream: (s) => { setTimeout(() => s.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n'), 300) },
  info: (s) => s.write('HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok'),
}

const upstream = net.createServer((socket) => {
  let buffer = Buffer.alloc(0)
  socket.on('data', (chunk: Buffer) => {
    buffer = Buffer.concat([buffer, chunk])
    const text = buffer.toString('latin1')
    const end = text.indexOf('\r\n\r\n')
    if (end < 0) return
    const head = text.slice(0, end)
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0)
    const chunked = /\r\ntransfer-encoding: *chunked/i.test(head)
    const bodyBytes = buffer.length - end - 4
    if (!chunked && bodyBytes < length) return
    if (chunked && !text.endsWith('0\r\n\r\n')) return
    seen.push(text)
    buffer = Buffer.alloc(0)
    const scenario = /\r\nx-scenario: *(\w+)/i.exec(head)?.[1] ?? 'json'
    ;(answers[scenario] ?? answers.json)?.(socket)
  })
  socket.on('error', () => undefined)
})
await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
const upstreamPort = (upstream.address() as net.AddressInfo).port

type ProxyPlugin = (app: FastifyInstance, options: UpstreamOptions) => Promise<void>

async function run(variant: ProxyPlugin): Promise<Array<{ name: string; upstream: string[]; client: string; events: string[] }>> {
  let counter = 0
  const events: string[] = []
  const app = Fastify({ genReqId: () => `req-${++counter}`, bodyLimit: 1_048_576 })
  app.decorateRequest('apiKey', null)
  app.addHook('onRequest', (request, _reply, done) => {
    ;(request as unknown as { apiKey: unknown }).apiKey = { id: 'key_test', plan: 'free' }
    done()
  })
  app.addHook('onSend', async (_request, reply, payload) => {
    reply.header('x-ratelimit-remaining', '42')
    return payload
  })
  await app.register(errorBodies, { codes: gatewayFrameworkErrors })
  await app.register(variant, {
    name: 'pets',
    url: `http://127.0.0.1:${upstreamPort}`,
    timeoutMillis: 500,
    maxInFlight: DEFAULT_MAX_IN_FLIGHT,
    internalToken: 'internal-secret',
    internalTokenVariable: 'INTERNAL_TOKEN',
    publicPath: '/v1/pets',
    upstreamPath: '/pets',
    observer: {
      response: (name, status) => events.push(`response ${name} ${status}`),
      failure: (name, kind) => events.push(`failure ${name} ${kind}`),
    },
  })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const port = (app.server.address() as net.AddressInfo).port

  function raw(bytes: string, wait = 2_500): Promise<string> {
    return new Promise((resolve) => {
      const chunks: Buffer[] = []
      const socket = net.connect(port, '127.0.0.1', () => socket.write(Buffer.from(bytes, 'latin1')))
      socket.on('data', (chunk: Buffer) => chunks.push(chunk))
      socket.on('error', () => undefined)
      const done = () => resolve(Buffer.concat(chunks).toString('latin1'))
      socket.on('close', done)
      setTimeout(() => { socket.destroy(); done() }, wait)
    })
  }

  const requests: Array<[string, string]> = [
    ['get json', 'GET /v1/pets?limit=5&q=%20a&q=b HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer secretkey\r\nX-Internal-Token: forged\r\nX-Consumer-Id: other\r\nX-Forwarded-For: 6.6.6.6\r\nX-Request-Id: client-id\r\nAccept: application/json\r\nConnection: close\r\n\r\n'],
    ['duplicate request headers', 'GET /v1/pets HTTP/1.1\r\nHost: gw\r\nX-Custom: 1\r\nX-Custom: 2\r\nCookie: a=1\r\nCookie: b=2\r\nAccept: a\r\nAccept: b\r\nConnection: close\r\n\r\n'],
    ['connection names authorization', 'GET /v1/pets HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k\r\nX-Keep: 1\r\nConnection: close, x-keep\r\n\r\n'],
    ['no host header', 'GET /v1/pets HTTP/1.0\r\n\r\n'],
    ['get keepalive', 'GET /v1/pets/1 HTTP/1.1\r\nHost: gw\r\nUser-Agent: test\r\n\r\n'],
    ['connection named', 'GET /v1/pets HTTP/1.1\r\nHost: gw\r\nConnection: X-Foo, close\r\nX-Foo: bar\r\nKeep-Alive: 5\r\nTE: trailers\r\n\r\n'],
    ['encoded path', 'GET /v1/pets/a%20b HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['dot segment', 'GET /v1/pets/./1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['three dots', 'GET /v1/pets/... HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['dotdot encoded', 'GET /v1/pets/%2e%2e/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['sub-delims', "GET /v1/pets/a!$&'()*+,;=:@b HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"],
    ['utf8 path', 'GET /v1/pets/caf\xc3\xa9 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['pipe path', 'GET /v1/pets/a|b^c HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['double slash', 'GET /v1/pets//x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['trailing slash', 'GET /v1/pets/ HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['post json', 'POST /v1/pets HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 31\r\nConnection: close\r\n\r\n{"name":"Rex",  "categoryId":1}'],
    ['post no type', 'POST /v1/pets HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc'],
    ['post chunked', 'POST /v1/pets HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n'],
    ['post empty', 'POST /v1/pets HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'],
    ['put', 'PUT /v1/pets/1 HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}'],
    ['delete', 'DELETE /v1/pets/1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nX-Scenario: nocontent\r\n\r\n'],
    ['delete with length 0', 'DELETE /v1/pets/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'],
    ['options', 'OPTIONS /v1/pets HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n'],
    ['head', 'HEAD /v1/pets HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nX-Scenario: head\r\n\r\n'],
    ['get with body', 'GET /v1/pets HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc'],
    ['too large', `POST /v1/pets HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 1048577\r\nConnection: close\r\n\r\n${'x'.repeat(1_048_577)}`],
  ]
  for (const scenario of Object.keys(answers)) {
    if (scenario === 'json') continue
    requests.push([`scenario ${scenario}`, `GET /v1/pets HTTP/1.1\r\nHost: gw\r\nX-Scenario: ${scenario}\r\nConnection: close\r\n\r\n`])
  }

  const out: Array<{ name: string; upstream: string[]; client: string; events: string[] }> = []
  const normalise = (text: string) =>
    text
      .replaceAll(String(upstreamPort), 'UPSTREAM')
      .replaceAll(String(port), 'GATEWAY')
      .replace(/\r\ndate: [^\r]*/gi, '\r\ndate: D')
      .replace(/x{1000,}/g, (m) => `x*${m.length}`)
  for (const [name, bytes] of requests) {
    seen.length = 0
    events.length = 0
    const aborts = name.includes('scenario late')
    const got = await raw(bytes, aborts ? 100 : 2_500)
    await new Promise((resolve) => setTimeout(resolve, aborts ? 600 : 50))
    out.push({ name, upstream: seen.map(normalise), client: normalise(got), events: [...events] })
  }
  await app.close()
  return out
}

const before = await run(original)
const after = await run(tuned)
upstream.close()
let unexpected = 0
for (const [index, old] of before.entries()) {
  const now = after[index]
  if (!now) continue
  const differs = (['upstream', 'client', 'events'] as const).filter((part) =>
    part === 'upstream'
      ? JSON.stringify(comparableUpstream(old.upstream)) !== JSON.stringify(comparableUpstream(now.upstream))
      : JSON.stringify(old[part]) !== JSON.stringify(now[part]),
  )
  const known = againstReplyFrom && KNOWN_DIFFERENCES.has(old.name)
  if (differs.length > 0 && !known) unexpected += 1
  const verdict = differs.length === 0 ? 'same' : `${known ? 'known difference' : 'DIFFERENT'} (${differs.join(', ')})`
  console.log(`${verdict.padEnd(40)} ${old.name}`)
  if ((values.show ?? []).includes(old.name) || (differs.length > 0 && !known)) {
    console.log(`  before: ${JSON.stringify(old)}\n  after:  ${JSON.stringify(now)}`)
  }
}
console.log(`${before.length} requests, ${unexpected} unexpected differences`)
process.exit(unexpected === 0 ? 0 : 1)
