import http from 'node:http'
import net from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { afterEach, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { serveOnLoopback } from '../helpers/fakeUpstreams.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { openRaw } from '../helpers/rawClient.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { exitWithin, killAll, waitForPortClosed } from '../scripts/processes.ts'
import { startGatewayProcess } from './gatewayProcess.ts'

const UPSTREAM_DELAY_MILLIS = 1_500

/**
 * An upstream whose /auth-check (the gateway's readiness probe) answers at once and whose catalogue
 * answers after 1.5 s; `firstRequest` gives the time the first catalogue request arrived.
 */
async function slowUpstream(delayMillis = UPSTREAM_DELAY_MILLIS) {
  let arrived: (at: number) => void = () => undefined
  const firstRequest = new Promise<number>((resolve) => (arrived = resolve))
  let received = 0
  const server = http.createServer((request, response) => {
    if (request.url === '/auth-check') {
      response.writeHead(204).end()
      return
    }
    received++
    arrived(Date.now())
    setTimeout(() => {
      response.setHeader('content-type', 'application/json')
      response.end('[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]')
    }, delayMillis)
  })
  return { ...(await serveOnLoopback(server)), firstRequest, received: () => received }
}

describe('gateway shutdown on SIGTERM', () => {
  const database = suiteDatabase()
  afterEach(killAll)

  it('turns /readyz to 503 first, lets the in-flight request finish 200, then closes and exits 0', async () => {
    const upstream = await slowUpstream()
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url })
    const pool = createPool({ connectionString: database.url, applicationName: 'ops-test' })
    try {
      // The gateway migrated the database at boot; issue a key the way the CLI does.
      const { key } = await createKeyRepository(pool).create({ name: 'drain', plan: 'pro' })
      expect((await gateway.readyz()).status).toBe(200)

      const inFlight = fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
      // The request is in flight for the upstream's 1.5 s from its arrival there, however long it
      // took the gateway to get it there (a key lookup, on a loaded machine, can take most of that).
      const started = await upstream.firstRequest
      gateway.proc.child.kill('SIGTERM')

      // While the request is still with the upstream, the gateway already reports not ready.
      let sawNotReady = false
      while (Date.now() - started < UPSTREAM_DELAY_MILLIS - 200) {
        try {
          const ready = await gateway.readyz()
          if (ready.status === 503) {
            expect(ready.body.status).toBe('shutting_down')
            sawNotReady = true
            break
          }
        } catch {
          sawNotReady = true // the ops port refusing connections is "not ready" too
          break
        }
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
      expect(sawNotReady, 'readiness turned false while the request was in flight').toBe(true)
      expect(Date.now() - started).toBeLessThan(UPSTREAM_DELAY_MILLIS)

      // No new connection is accepted on the API port during the drain.
      await expect(fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })).rejects.toThrow()

      const response = await inFlight
      expect(response.status).toBe(200)
      expect(response.headers.get('connection')).toBe('close')
      expect(await response.json()).toEqual([{ id: 1, name: 'Rex', categoryId: 1, status: 'available' }])
      expect(Date.now() - started).toBeGreaterThanOrEqual(UPSTREAM_DELAY_MILLIS - 50)

      const exit = await exitWithin(gateway.proc, 5_000)
      expect(exit, gateway.proc.output()).toEqual({ code: 0, signal: null })
      await waitForPortClosed(gateway.apiPort, 1_000)
      await waitForPortClosed(gateway.opsPort, 1_000)
    } finally {
      await pool.end()
      await upstream.close()
      gateway.cleanup()
    }
  })

  it('with a drain, keeps answering keep-alive clients after SIGTERM with Connection: close, resets none of them, then exits 0', async () => {
    const upstream = await slowUpstream(5)
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url, env: { SHUTDOWN_DRAIN_SECONDS: '2' } })
    const pool = createPool({ connectionString: database.url, applicationName: 'ops-test' })
    const agent = new http.Agent({ keepAlive: true, maxSockets: 4 })
    try {
      const { key } = await createKeyRepository(pool).create({ name: 'drain-keep-alive', plan: 'business' })
      let signalledAt = Infinity
      const answers: { status: number; connection: string | undefined; afterSignal: boolean }[] = []
      const failures: string[] = []
      const send = () =>
        new Promise<void>((resolve) => {
          const sentAt = performance.now()
          const request = http.get(`${gateway.url}/v1/pets`, { agent, headers: { authorization: `Bearer ${key}` } }, (response) => {
            response.resume()
            response.on('end', () => {
              answers.push({ status: response.statusCode ?? 0, connection: response.headers.connection, afterSignal: sentAt > signalledAt })
              resolve()
            })
          })
          request.on('error', (error: NodeJS.ErrnoException) => {
            // Once the listener has closed, a client that ignored /readyz is refused a new connection:
            // expected. A reset (a request sent on a socket the gateway destroyed) is the defect.
            if (error.code !== 'ECONNREFUSED') failures.push(`${error.code ?? ''} ${error.message}`)
            resolve()
          })
        })
      let running = true
      const clients = Array.from({ length: 4 }, async () => {
        while (running) await send()
      })
      await new Promise((resolve) => setTimeout(resolve, 500))
      signalledAt = performance.now()
      gateway.proc.child.kill('SIGTERM')
      await new Promise((resolve) => setTimeout(resolve, 300))
      expect((await gateway.readyz()).status).toBe(503)
      // A load balancer that saw /readyz fail stops sending here a moment later.
      await new Promise((resolve) => setTimeout(resolve, 700))
      running = false
      await Promise.all(clients)
      const exit = await exitWithin(gateway.proc, 10_000)
      const exitedAfter = performance.now() - signalledAt

      expect(exit, gateway.proc.output()).toEqual({ code: 0, signal: null })
      expect(failures).toEqual([])
      const served = answers.filter((answer) => answer.afterSignal)
      expect(served.length).toBeGreaterThan(10)
      for (const answer of served) {
        expect(answer.status).toBe(200)
        expect(answer.connection).toBe('close')
      }
      // The drain lasts its whole 2 s, whatever the clients do, then the gateway closes at once.
      expect(exitedAfter).toBeGreaterThanOrEqual(2_000)
      expect(exitedAfter).toBeLessThan(5_000)
    } finally {
      agent.destroy()
      await pool.end()
      await upstream.close()
      gateway.cleanup()
    }
  })

  it('lets 50 concurrent in-flight requests all finish 200 on SIGTERM, then exits 0', async () => {
    const concurrent = 50
    const upstream = await slowUpstream()
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url })
    const pool = createPool({ connectionString: database.url, applicationName: 'ops-test' })
    try {
      const { key } = await createKeyRepository(pool).create({ name: 'drain-many', plan: 'pro' })
      const started = Date.now()
      const inFlight = Array.from({ length: concurrent }, () =>
        fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } }).then(async (response) => ({
          status: response.status,
          connection: response.headers.get('connection'),
          body: (await response.json()) as unknown,
          millis: Date.now() - started,
        })),
      )
      // Every request has reached the upstream (each is held there 1.5 s) before the signal.
      const deadline = Date.now() + 10_000
      while (upstream.received() < concurrent && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20))
      expect(upstream.received()).toBe(concurrent)
      const signalledAt = Date.now() - started
      gateway.proc.child.kill('SIGTERM')

      const answers = await Promise.all(inFlight)
      expect(answers.map((answer) => answer.status)).toEqual(Array(concurrent).fill(200))
      for (const answer of answers) {
        expect(answer.body).toEqual([{ id: 1, name: 'Rex', categoryId: 1, status: 'available' }])
        expect(answer.connection).toBe('close')
      }
      const exit = await exitWithin(gateway.proc, 10_000)
      expect(exit, gateway.proc.output()).toEqual({ code: 0, signal: null })
      const exitedAt = Date.now() - started
      await waitForPortClosed(gateway.apiPort, 1_000)

      const slowest = Math.max(...answers.map((answer) => answer.millis))
      recordScenario({
        area: 'Gateway',
        scenario: `SIGTERM to a gateway process with ${concurrent} requests in flight (upstream holds each 1.5 s)`,
        answered: `${concurrent} of ${concurrent} answered 200 with Connection: close, the last ${slowest} ms after sending (signal at ${signalledAt} ms); exit code 0 at ${exitedAt} ms`,
        lost: `nothing: ${concurrent} of ${concurrent} complete bodies, no reset connection`,
        test: 'test/ops/shutdown.int.test.ts',
      })
    } finally {
      await pool.end()
      await upstream.close()
      gateway.cleanup()
    }
  })

  // Node's close() took a connection that had sent no request for a busy one, and stopped the
  // header timeouts that would have ended it: three held the shutdown to its deadline (exit 1).
  it('closes connections that never sent a request, lets the one in flight finish 200, and exits 0 before its deadline', async () => {
    const upstream = await slowUpstream()
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url })
    const pool = createPool({ connectionString: database.url, applicationName: 'ops-test' })
    const quiet: net.Socket[] = []
    try {
      const { key } = await createKeyRepository(pool).create({ name: 'quiet', plan: 'pro' })
      const { port } = new URL(gateway.url)
      for (let i = 0; i < 3; i++) {
        const socket = net.connect(Number(port), '127.0.0.1')
        socket.on('error', () => undefined)
        await new Promise((resolve) => socket.once('connect', resolve))
        quiet.push(socket)
      }
      const inFlight = fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
      await upstream.firstRequest
      gateway.proc.child.kill('SIGTERM')
      expect((await inFlight).status).toBe(200)
      const exit = await exitWithin(gateway.proc, 20_000)
      expect(exit, gateway.proc.output()).toEqual({ code: 0, signal: null })
      expect(gateway.proc.output()).not.toContain('shutdown deadline passed')
      expect(quiet.every((socket) => socket.destroyed || socket.readableEnded)).toBe(true)
    } finally {
      for (const socket of quiet) socket.destroy()
      await pool.end()
      await upstream.close()
      gateway.cleanup()
    }
  })

  // Node's close() waited for a request whose body was still arriving, bounded only by the 30 s
  // request timeout: one slow client held every shutdown to its 15 s deadline (exit 1).
  it('answers 503 to a create whose body is still arriving, forwards nothing, and exits 0 before its deadline', async () => {
    const upstream = await slowUpstream()
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url })
    const pool = createPool({ connectionString: database.url, applicationName: 'ops-test' })
    try {
      const { key } = await createKeyRepository(pool).create({ name: 'slow-body', plan: 'pro' })
      const connection = await openRaw(gateway.url)
      connection.socket.write(
        `POST /v1/pets HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"name":`,
      )
      const slowBody = connection.dribble(' '.repeat(200), 100)
      await sleep(500)
      const signalledAt = Date.now()
      gateway.proc.child.kill('SIGTERM')
      await connection.closed
      await slowBody
      const exit = await exitWithin(gateway.proc, 20_000)
      const exitedAfter = Date.now() - signalledAt
      expect(exit, gateway.proc.output()).toEqual({ code: 0, signal: null })
      expect(gateway.proc.output()).not.toContain('shutdown deadline passed')
      expect(connection.answer()).toMatch(/^HTTP\/1\.1 503 Service Unavailable\r\n[\s\S]*connection: close\r\n[\s\S]*"code":"service_unavailable"/i)
      expect(connection.answer()).toMatch(/\r\nx-ratelimit-remaining: \d+\r\n/i)
      expect(connection.answer()).toMatch(/\r\nretry-after: 1\r\n/i)
      expect(upstream.received()).toBe(0)
      recordScenario({
        area: 'Gateway',
        scenario: "SIGTERM to a gateway process while a client is still sending a create's body (one byte every 100 ms)",
        answered: `503 service_unavailable with Connection: close and the rate-limit headers; exit code 0 ${exitedAfter} ms after the signal (no drain set)`,
        lost: 'nothing: the body was not whole, so nothing was forwarded; the client may retry the create',
        test: 'test/ops/shutdown.int.test.ts',
      })
    } finally {
      await pool.end()
      await upstream.close()
      gateway.cleanup()
    }
  })

  it('with its Postgres hung (connections open, nothing answered), still stops within seconds and exits 0', async () => {
    const upstream = await slowUpstream()
    const { hostname, port } = new URL(database.url)
    const relay = await cuttableRelay({ host: hostname, port: Number(port || 5432) })
    const throughRelay = new URL(database.url)
    throughRelay.port = String(relay.port)
    const gateway = await startGatewayProcess({ databaseUrl: throughRelay.toString(), petsUrl: upstream.url })
    try {
      await relay.silence()
      const started = Date.now()
      gateway.proc.child.kill('SIGTERM')
      // Closing each connection to a server that never answers is given up after 1 s: the change
      // feed's, the unbans' and the pool's, not the 15 s deadline's forced exit 1.
      const exit = await exitWithin(gateway.proc, 20_000)
      const millis = Date.now() - started
      expect(exit, gateway.proc.output()).toEqual({ code: 0, signal: null })
      expect(millis).toBeLessThan(10_000)
      expect(gateway.proc.output()).toContain('shutdown step did not finish in time')
    } finally {
      await relay.close()
      await upstream.close()
      gateway.cleanup()
    }
  })
})
