import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import https from 'node:https'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { OPENSSL, issueCertificate, makeCa, opensslMissing, type TestCa, type TestCertificate } from '../helpers/certificates.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { exitWithin, killAll } from '../scripts/processes.ts'
import { startGatewayProcess, type GatewayProcess } from './gatewayProcess.ts'

interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: string
  /** The serial of the certificate the connection was served with. */
  serialNumber: string
  socket: tls.TLSSocket
}

/** One HTTPS request trusting only `ca`; `agent` false: a new connection, so a new handshake. */
function get(port: number, ca: string, pathAndQuery: string, headers: Record<string, string> = {}, agent: https.Agent | false = false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const request = https.get({ host: '127.0.0.1', port, path: pathAndQuery, ca, headers, agent, timeout: 5_000 }, (response) => {
      const socket = response.socket as tls.TLSSocket
      const serialNumber = socket.getPeerCertificate().serialNumber
      let body = ''
      response.setEncoding('utf8')
      response.on('data', (chunk: string) => (body += chunk))
      response.on('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body, serialNumber, socket }))
    })
    request.on('timeout', () => request.destroy(new Error('no answer within 5 s')))
    request.on('error', reject)
  })
}

/** What a raw TCP client sees after writing `bytes`: the bytes that came back and how long until the server closed. */
function rawExchange(port: number, bytes: string | Buffer): Promise<{ received: Buffer; closedAfterMillis: number }> {
  return new Promise((resolve, reject) => {
    const started = Date.now()
    const chunks: Buffer[] = []
    const socket = net.connect(port, '127.0.0.1', () => socket.write(bytes))
    socket.setTimeout(5_000, () => reject(new Error('the server kept the connection open for 5 s')))
    socket.on('data', (chunk: Buffer) => chunks.push(chunk))
    socket.on('error', () => undefined)
    socket.on('close', () => resolve({ received: Buffer.concat(chunks), closedAfterMillis: Date.now() - started }))
  })
}

/** A TLS handshake, resolved with its error (or undefined when it succeeded, then closed). */
function handshake(options: tls.ConnectionOptions): Promise<Error | undefined> {
  return new Promise((resolve) => {
    const socket = tls.connect({ host: '127.0.0.1', ...options }, () => {
      socket.end()
      resolve(undefined)
    })
    socket.on('error', resolve)
  })
}

/** The gateway's failed-handshake count for each reason, from its ops port. */
async function handshakeFailures(opsUrl: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${opsUrl}/metrics`)).text()
  return Object.fromEntries([...text.matchAll(/^gateway_tls_handshake_failures_total\{reason="(\w+)"\} (\d+)$/gm)].map(([, reason, count]) => [reason, Number(count)]))
}

/** The gateway's log lines about failed handshakes, as JSON. */
function handshakeLines(output: string): Array<Record<string, unknown>> {
  return output
    .split('\n')
    .filter((line) => line.includes('TLS handshakes failed'))
    .map((line) => JSON.parse(line) as Record<string, unknown>)
}

/** Puts `from`'s files where the gateway reads its pair: each renamed over the old one, as a deploy tool would. */
function install(from: TestCertificate, to: { certFile: string; keyFile: string }) {
  for (const [source, target] of [[from.certFile, to.certFile], [from.keyFile, to.keyFile]] as const) {
    copyFileSync(source, `${target}.new`)
    renameSync(`${target}.new`, target)
  }
}

describe.skipIf(opensslMissing)('HTTPS on the public port (server.tls)', () => {
  const database = suiteDatabase()
  let directory: string
  let ca: TestCa
  let first: TestCertificate
  let second: TestCertificate
  let third: TestCertificate
  let served: { certFile: string; keyFile: string }
  let upstream: TestUpstream
  let gateway: GatewayProcess & { cleanup(): void }
  let key: string

  beforeAll(async () => {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-tls-'))
    ca = makeCa(directory)
    first = issueCertificate(ca, 'first', 'A001')
    second = issueCertificate(ca, 'second', 'A002')
    third = issueCertificate(ca, 'third', 'A003')
    served = { certFile: path.join(directory, 'served.crt'), keyFile: path.join(directory, 'served.key') }
    install(first, served)
    upstream = await recordingUpstream()
    gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      configure: (file) => {
        file.server.tls = served
      },
    })
    const pool = createPool({ connectionString: database.url, applicationName: 'tls-test' })
    try {
      key = (await createKeyRepository(pool).create({ name: 'tls', plan: 'pro' })).key
    } finally {
      await pool.end()
    }
  })
  afterAll(async () => {
    await killAll()
    gateway?.cleanup()
    await upstream?.close()
    rmSync(directory, { recursive: true, force: true })
  })

  it('answers over HTTPS with the rate-limit headers; the ops port stays plain HTTP', async () => {
    const answer = await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` })
    expect(answer.status).toBe(200)
    expect(answer.headers['x-ratelimit-limit']).toBeDefined()
    expect(answer.headers['x-ratelimit-remaining']).toBeDefined()
    expect(answer.serialNumber).toBe('A001')
    expect(answer.socket.alpnProtocol === false || answer.socket.alpnProtocol === 'http/1.1').toBe(true)
    // Without a key: the anonymous limit and 401, over TLS too.
    expect((await get(gateway.apiPort, ca.pem, '/v1/pets')).status).toBe(401)
    expect((await fetch(`${gateway.opsUrl}/healthz`)).status).toBe(200)
    const metrics = await (await fetch(`${gateway.opsUrl}/metrics`)).text()
    expect(metrics).toMatch(/^gateway_tls_last_reload_successful 1$/m)
    expect(metrics).toMatch(/^gateway_tls_certificate_expiry_timestamp_seconds \d+/m)
  })

  it('a request without Host is refused by the gateway (400 Error body), as on plain HTTP: the HTTP server options reach the HTTPS server', async () => {
    const answer = await new Promise<string>((resolve, reject) => {
      let text = ''
      const socket = tls.connect({ host: '127.0.0.1', port: gateway.apiPort, ca: ca.pem, servername: 'localhost' }, () => {
        socket.write(`GET /v1/pets HTTP/1.1\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n\r\n`)
      })
      socket.setEncoding('utf8')
      socket.on('data', (chunk: string) => (text += chunk))
      socket.on('end', () => resolve(text))
      socket.on('error', reject)
    })
    // Node's own refusal would be a bare `400 Bad Request` with no body.
    expect(answer).toMatch(/^HTTP\/1\.1 400 /)
    expect(answer).toContain('"code":"bad_request"')
  })

  it('plain HTTP to the HTTPS port is closed at once, no hang; the gateway keeps serving', async () => {
    const plain = await rawExchange(gateway.apiPort, 'GET /v1/pets HTTP/1.1\r\nHost: x\r\n\r\n')
    expect(plain.closedAfterMillis).toBeLessThan(2_000)
    await expect(fetch(`http://127.0.0.1:${gateway.apiPort}/v1/pets`, { signal: AbortSignal.timeout(3_000) })).rejects.toThrow()
    expect((await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` })).status).toBe(200)
  })

  it('bad handshakes (garbage, an untrusted client, only h2 offered, a half handshake) do not crash it', async () => {
    const garbage = await rawExchange(gateway.apiPort, Buffer.from('\x16\x03\x01\x00\x05hello, not a ClientHello', 'latin1'))
    expect(garbage.closedAfterMillis).toBeLessThan(2_000)
    // A client that does not trust the certificate aborts its own handshake.
    expect(await handshake({ port: gateway.apiPort, servername: 'localhost' })).toMatchObject({ code: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' })
    // HTTP/1.1 only: a client that would speak h2 alone is refused in the handshake.
    expect(await handshake({ port: gateway.apiPort, ca: ca.pem, servername: 'localhost', ALPNProtocols: ['h2'] })).toBeInstanceOf(Error)
    // One that offers both is given http/1.1.
    const both = await new Promise<string | false | null>((resolve, reject) => {
      const socket = tls.connect({ host: '127.0.0.1', port: gateway.apiPort, ca: ca.pem, servername: 'localhost', ALPNProtocols: ['h2', 'http/1.1'] }, () => {
        resolve(socket.alpnProtocol)
        socket.end()
      })
      socket.on('error', reject)
    })
    expect(both).toBe('http/1.1')
    // A half handshake: the ClientHello sent, then the client gone before the handshake ends.
    await new Promise<void>((resolve) => {
      const socket = tls.connect({ host: '127.0.0.1', port: gateway.apiPort, ca: ca.pem, servername: 'localhost' })
      socket.on('error', () => undefined)
      socket.once('connect', () => setImmediate(() => (socket.destroy(), resolve())))
    })
    expect(gateway.proc.hasExited()).toBe(false)
    expect((await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` })).status).toBe(200)
  })

  it('failed handshakes (plain HTTP, an unknown CA, an old TLS version, no shared cipher) are counted by reason and logged once per reason, not once per connection', async () => {
    const before = await handshakeFailures(gateway.opsUrl)
    expect(Object.keys(before).sort()).toEqual(
      ['alpn', 'bad_certificate', 'certificate_expired', 'closed', 'http_request', 'no_shared_cipher', 'other', 'timeout', 'unknown_ca', 'version'],
    )
    for (let i = 0; i < 5; i++) await rawExchange(gateway.apiPort, `GET /v1/pets?i=${i} HTTP/1.1\r\nHost: \u001b[31mzebra\r\n\r\n`)
    // openssl (as curl and browsers) tells the server why it gives up: an unknown CA.
    const untrusting = makeCa(directory, 'other-ca')
    for (let i = 0; i < 2; i++) {
      expect(() =>
        execFileSync(OPENSSL, ['s_client', '-connect', `127.0.0.1:${gateway.apiPort}`, '-CAfile', untrusting.certFile, '-verify_return_error', '-servername', 'localhost'], {
          input: '',
          stdio: ['pipe', 'ignore', 'ignore'],
        }),
      ).toThrow()
    }
    expect(await handshake({ port: gateway.apiPort, ca: ca.pem, servername: 'localhost', minVersion: 'TLSv1', maxVersion: 'TLSv1.1' })).toBeInstanceOf(Error)
    expect(await handshake({ port: gateway.apiPort, ca: ca.pem, servername: 'localhost', maxVersion: 'TLSv1.2', ciphers: 'AES128-SHA' })).toBeInstanceOf(Error)
    // Node's own client, refusing the certificate, hangs up without an alert.
    expect(await handshake({ port: gateway.apiPort, ca: untrusting.pem, servername: 'localhost' })).toMatchObject({ code: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' })
    // A TCP check that connects and closes sends nothing: not a handshake.
    await new Promise<void>((resolve, reject) => {
      const socket = net.connect(gateway.apiPort, '127.0.0.1', () => socket.end())
      socket.on('error', reject)
      socket.on('close', () => resolve())
    })

    await vi.waitFor(async () => {
      const after = await handshakeFailures(gateway.opsUrl)
      const delta = Object.fromEntries(Object.entries(after).map(([reason, count]) => [reason, count - (before[reason] ?? 0)]))
      expect(delta).toEqual({ http_request: 5, unknown_ca: 2, version: 1, no_shared_cipher: 1, closed: 1, alpn: 0, bad_certificate: 0, certificate_expired: 0, timeout: 0, other: 0 })
    }, { timeout: 5_000, interval: 100 })
    // The log is written in batches.
    await vi.waitFor(() => expect(handshakeLines(gateway.proc.output()).some((line) => line.reason === 'no_shared_cipher')).toBe(true), { timeout: 5_000, interval: 100 })
    const lines = handshakeLines(gateway.proc.output())
    const of = (reason: string) => lines.filter((line) => line.reason === reason)
    // The first failure of a reason is logged at once; the rest of the minute's are counted in the next line.
    expect(of('http_request')[0]).toMatchObject({ level: 40, count: 1, code: 'ERR_SSL_HTTP_REQUEST', lastRemoteAddress: '127.0.0.1' })
    expect(of('http_request').length).toBeLessThan(3)
    expect(of('unknown_ca')).toEqual([expect.objectContaining({ count: 1, code: 'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA' })])
    expect(of('version')).toEqual([expect.objectContaining({ count: 1, code: 'ERR_SSL_UNSUPPORTED_PROTOCOL' })])
    expect(of('no_shared_cipher')).toEqual([expect.objectContaining({ count: 1, code: 'ERR_SSL_NO_SHARED_CIPHER' })])
    // Each line names the client, one that hung up mid-handshake (its socket already closed) too.
    await vi.waitFor(() => expect(handshakeLines(gateway.proc.output()).some((line) => line.reason === 'closed')).toBe(true), { timeout: 5_000, interval: 100 })
    for (const line of handshakeLines(gateway.proc.output())) expect(line, String(line.reason)).toMatchObject({ lastRemoteAddress: '127.0.0.1' })
    // Nothing the client sent reaches the log.
    expect(lines.map((line) => JSON.stringify(line)).join('\n')).not.toMatch(/zebra|GET|v1\/pets|\\u001b/)
    expect((await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` })).status).toBe(200)
  })

  it('rotates on SIGHUP: new connections get the new certificate, an open connection keeps its own and keeps working', async () => {
    const keepAlive = new https.Agent({ keepAlive: true, maxSockets: 1 })
    try {
      const before = await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` }, keepAlive)
      expect(before.serialNumber).toBe('A001')
      install(second, served)
      gateway.proc.child.kill('SIGHUP')
      await vi.waitFor(async () => expect((await get(gateway.apiPort, ca.pem, '/v1/pets')).serialNumber).toBe('A002'), { timeout: 5_000, interval: 100 })
      const again = await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` }, keepAlive)
      expect(again.socket).toBe(before.socket)
      expect(again.status).toBe(200)
      expect(again.serialNumber).toBe('A001')
      expect(await (await fetch(`${gateway.opsUrl}/metrics`)).text()).toMatch(/^gateway_tls_reloads_total\{outcome="success"\} 1$/m)
    } finally {
      keepAlive.destroy()
    }
  })

  it('an invalid replacement (a key that is not the certificate\'s) keeps the pair in force and says why; a valid one after it is taken', async () => {
    const inForce = (await get(gateway.apiPort, ca.pem, '/v1/pets')).serialNumber
    copyFileSync(third.certFile, `${served.certFile}.new`)
    renameSync(`${served.certFile}.new`, served.certFile)
    gateway.proc.child.kill('SIGHUP')
    await vi.waitFor(async () => expect(gateway.proc.output()).toContain('TLS certificate reload refused'), { timeout: 5_000, interval: 100 })
    expect(gateway.proc.output()).toContain(`${served.keyFile} is not the private key of the certificate in ${served.certFile}`)
    expect((await get(gateway.apiPort, ca.pem, '/v1/pets')).serialNumber).toBe(inForce)
    expect(await (await fetch(`${gateway.opsUrl}/metrics`)).text()).toMatch(/^gateway_tls_last_reload_successful 0$/m)
    // Garbage in the key file too: still the old pair, and the process still up.
    writeFileSync(served.keyFile, 'garbage\n')
    gateway.proc.child.kill('SIGHUP')
    await vi.waitFor(async () => expect(gateway.proc.output()).toContain('holds no PEM private key'), { timeout: 5_000, interval: 100 })
    expect((await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` })).status).toBe(200)
    // The key arrives: the files' change alone (no signal) brings the new pair in.
    copyFileSync(third.keyFile, `${served.keyFile}.new`)
    renameSync(`${served.keyFile}.new`, served.keyFile)
    await vi.waitFor(async () => expect((await get(gateway.apiPort, ca.pem, '/v1/pets')).serialNumber).toBe('A003'), { timeout: 10_000, interval: 100 })
    expect(await (await fetch(`${gateway.opsUrl}/metrics`)).text()).toMatch(/^gateway_tls_last_reload_successful 1$/m)
  })

  it('closes gracefully on SIGTERM with an idle keep-alive TLS connection open', async () => {
    const keepAlive = new https.Agent({ keepAlive: true, maxSockets: 1 })
    try {
      expect((await get(gateway.apiPort, ca.pem, '/v1/pets', { authorization: `Bearer ${key}` }, keepAlive)).status).toBe(200)
      gateway.proc.child.kill('SIGTERM')
      expect(await exitWithin(gateway.proc, 10_000)).toEqual({ code: 0, signal: null })
    } finally {
      keepAlive.destroy()
    }
  })
})
