import { CLIENT_TIMEOUTS } from '../../common/src/http/clientErrors.ts'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startGateway } from '../helpers/gateway.ts'
import { createKey, staticUpstream } from '../helpers/loadTools.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { openRaw, parseAnswer, type RawConnection } from '../helpers/rawClient.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { maxOf, minOf, percentile, printedInSoak, scaled } from '../helpers/soak.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { startGatewayProcess, type GatewayProcess } from '../ops/gatewayProcess.ts'
import { killAll } from '../scripts/processes.ts'

const TEST = 'test/reliability/slowClients.int.test.ts'
/** Shorter than the production 10 s and 30 s so the cut-offs are seen within seconds. */
const TIMEOUTS = { ...CLIENT_TIMEOUTS, headersTimeoutMillis: 2_000, requestTimeoutMillis: 4_000 }
/** The production headers timeout, which the idle-connection test runs against. */
const PRODUCTION_HEADERS_TIMEOUT_MILLIS = 10_000
const IDLE_CONNECTIONS = scaled(2_000, 8_000)
/** Past the 10 s headers timeout, within the 60 s idle limit of a keep-alive connection. */
const IDLE_HOLD_MILLIS = scaled(12_000, 30_000)

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))
const PET = JSON.stringify({ name: 'Slowpoke', categoryId: 1 })

describe('slow and idle clients', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: pets.url, clientTimeouts: TIMEOUTS }))
  let key: string

  const petRows = async () => Number((await pets.pool.query<{ count: string }>('SELECT count(*) FROM pets.pets')).rows[0]!.count)
  const postHead = (contentLength: number) =>
    `POST /v1/pets HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer ${key}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${contentLength}\r\n\r\n`

  beforeAll(async () => {
    key = (await gateway.createKey({ plan: 'enterprise', perMinute: 100_000, perDay: 1_000_000 })).key
  })

  it('slowloris: headers dribbled a byte every 100 ms get 408 request_timeout and the socket closed at the headers timeout', async () => {
    const connection = await openRaw(gateway.url)
    // Headers that would take 30 s to finish at this pace; they never do.
    const dribbling = connection.dribble(`GET /v1/pets HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer ${key}\r\nX-Pad: ${'a'.repeat(300)}`, 100)
    const closedAfter = await connection.closed
    await dribbling
    const { statusLine, head, body } = parseAnswer(connection.answer())
    expect(statusLine).toBe('HTTP/1.1 408 Request Timeout')
    expect(head).toMatch(/content-type: application\/json/i)
    expect(body).toEqual({ code: 'request_timeout', message: expect.any(String), status: 408 })
    expect(closedAfter).toBeGreaterThanOrEqual(TIMEOUTS.headersTimeoutMillis - 100)
    // Node checks for expired headers on an interval (30 s unless set): the cut must follow the
    // timeout itself, not that interval.
    expect(closedAfter).toBeLessThan(2 * TIMEOUTS.headersTimeoutMillis)
    expect((await gateway.request('/v1/pets?limit=1', { key })).status).toBe(200)
    recordScenario(printedInSoak({
      area: 'Hostile input',
      scenario: `Slowloris: request headers dribbled one byte every 100 ms (headers timeout set to ${TIMEOUTS.headersTimeoutMillis} ms)`,
      answered: `408 request_timeout and the connection closed after ${Math.round(closedAfter)} ms; the next request got 200`,
      lost: 'nothing: no request reached the upstream',
      test: TEST,
    }))
  })

  it('a body dribbled slower than the request timeout gets 408 and creates no pet', async () => {
    const before = await petRows()
    const connection = await openRaw(gateway.url)
    // A valid JSON body of 400 bytes (trailing spaces): the whole of it would take 40 s at this pace.
    const slowBody = PET.padEnd(400, ' ')
    connection.socket.write(postHead(slowBody.length))
    const dribbling = connection.dribble(slowBody, 100)
    const closedAfter = await connection.closed
    await dribbling
    const { statusLine, body } = parseAnswer(connection.answer())
    expect(statusLine).toBe('HTTP/1.1 408 Request Timeout')
    expect(body).toEqual({ code: 'request_timeout', message: expect.any(String), status: 408 })
    expect(closedAfter).toBeGreaterThanOrEqual(TIMEOUTS.requestTimeoutMillis - 100)
    expect(closedAfter).toBeLessThan(2 * TIMEOUTS.requestTimeoutMillis)
    expect(await petRows()).toBe(before)
    const created = await gateway.request('/v1/pets', { key, method: 'POST', headers: { 'content-type': 'application/json' }, body: PET })
    expect(created.status).toBe(201)
    expect(await petRows()).toBe(before + 1)
    recordScenario(printedInSoak({
      area: 'Hostile input',
      scenario: `A POST body dribbled one byte every 100 ms (request timeout set to ${TIMEOUTS.requestTimeoutMillis} ms)`,
      answered: `408 request_timeout and the connection closed after ${Math.round(closedAfter)} ms; the next POST got 201`,
      lost: `nothing half-done: pet rows ${before} before, ${before} after the cut, ${before + 1} after the next POST`,
      test: TEST,
    }))
  })

  it('a body that ends before its Content-Length leaves no pet behind and the gateway keeps serving', async () => {
    const before = await petRows()
    const attempts = 20
    const answers: string[] = []
    for (let i = 0; i < attempts; i++) {
      const connection: RawConnection = await openRaw(gateway.url)
      // Content-Length promises 100 more bytes than are sent; then the client goes away.
      connection.socket.write(postHead(PET.length + 100) + PET)
      await sleep(20)
      if (i % 2 === 0) connection.socket.end()
      else connection.socket.destroy()
      await connection.closed
      answers.push(parseAnswer(connection.answer()).statusLine)
    }
    // Give any forwarded half-request time to land, were there one.
    await sleep(500)
    expect(await petRows()).toBe(before)
    for (const statusLine of answers) expect(['', 'HTTP/1.1 400 Bad Request']).toContain(statusLine)
    const listed = await gateway.request('/v1/pets?limit=1', { key })
    expect(listed.status).toBe(200)
    const created = await gateway.request('/v1/pets', { key, method: 'POST', headers: { 'content-type': 'application/json' }, body: PET })
    expect(created.status).toBe(201)
    expect(await petRows()).toBe(before + 1)
    recordScenario(printedInSoak({
      area: 'Hostile input',
      scenario: `${attempts} POSTs whose body stops ${100} bytes short of Content-Length, then the client closes (FIN or reset)`,
      answered: `no answer or 400 to the broken requests (${answers.filter((line) => line === '').length} silent closes); the next GET got 200 and the next POST 201`,
      lost: `nothing half-done: pet rows ${before} before and after the broken requests, ${before + 1} after one complete POST`,
      test: TEST,
    }))
  })

  describe('idle connections on a gateway process with the production timeouts', () => {
    let upstream: Awaited<ReturnType<typeof staticUpstream>>
    let gatewayProcess: GatewayProcess & { cleanup(): void }
    const idle: RawConnection[] = []

    beforeAll(async () => {
      upstream = await staticUpstream()
      gatewayProcess = await startGatewayProcess({
        databaseUrl: database.url,
        petsUrl: upstream.url,
        // The idle connections stand for many clients but all come from this one address, which
        // server.maxConnectionsPerClient (1,000) would otherwise cap.
        configure: (file) => {
          file.server.maxConnectionsPerClient = IDLE_CONNECTIONS + 100
        },
      })
    })
    afterAll(async () => {
      for (const connection of idle) connection.socket.destroy()
      await killAll()
      gatewayProcess?.cleanup()
      await upstream?.close()
    })

    it(
      `${IDLE_CONNECTIONS} idle connections held open do not starve real clients; silent ones are closed at the headers timeout`,
      async () => {
        const { key: realKey } = await createKey(database.url, { plan: 'enterprise', perMinute: 1_000_000, perDay: 10_000_000 })
        const half = IDLE_CONNECTIONS / 2
        const openBatch = async (count: number, prepare: (connection: RawConnection) => Promise<void>) => {
          const opened: RawConnection[] = []
          for (let start = 0; start < count; start += 500) {
            const batch = await Promise.all(
              Array.from({ length: Math.min(500, count - start) }, async () => {
                const connection = await openRaw(gatewayProcess.url)
                await prepare(connection)
                return connection
              }),
            )
            opened.push(...batch)
          }
          idle.push(...opened)
          return opened
        }
        const openedAt = performance.now()
        // Half connect and send nothing at all: the headers timeout (10 s) is theirs.
        const silent = await openBatch(half, async () => undefined)
        // Half make one keep-alive request and then go quiet, as a client's idle pool does.
        const keptAlive = await openBatch(half, async (connection) => {
          connection.socket.write(`GET /v1/pets?limit=1 HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer ${realKey}\r\n\r\n`)
          const deadline = performance.now() + 30_000
          while (!connection.answer().endsWith('\r\n\r\n[]') && !connection.isClosed() && performance.now() < deadline) await sleep(20)
        })
        const openMillis = performance.now() - openedAt
        const keptAliveAnswered = keptAlive.filter((connection) => parseAnswer(connection.answer()).statusLine === 'HTTP/1.1 200 OK').length
        expect(keptAliveAnswered).toBe(half)
        // Real clients, four at a time, while the idle connections are held.
        const statuses = new Map<number, number>()
        const latencies: number[] = []
        const holdUntil = performance.now() + IDLE_HOLD_MILLIS
        await Promise.all(
          Array.from({ length: 4 }, async () => {
            while (performance.now() < holdUntil) {
              const sent = performance.now()
              const response = await fetch(`${gatewayProcess.url}/v1/pets?limit=1`, {
                headers: { authorization: `Bearer ${realKey}` },
                // The gateway's own bound for an answer: the upstream timeout (10 s).
                signal: AbortSignal.timeout(10_000),
              })
              await response.arrayBuffer()
              latencies.push(performance.now() - sent)
              statuses.set(response.status, (statuses.get(response.status) ?? 0) + 1)
            }
          }),
        )
        const heldMillis = performance.now() - openedAt
        expect(Object.fromEntries(statuses)).toEqual({ 200: latencies.length })
        expect(latencies.length).toBeGreaterThan(0)
        // The keep-alive connections are still open (the idle limit is 60 s)…
        const keptOpen = keptAlive.filter((connection) => !connection.isClosed()).length
        expect(keptOpen).toBe(half)
        // …and every silent one was answered 408 and closed at the headers timeout: they never pile up.
        const silentClosedAfter = await Promise.all(silent.map((connection) => connection.closed))
        const timedOut = silent.filter((connection) => parseAnswer(connection.answer()).statusLine === 'HTTP/1.1 408 Request Timeout').length
        expect(timedOut).toBe(half)
        const firstCut = minOf(silentClosedAfter)
        const lastCut = maxOf(silentClosedAfter)
        expect(firstCut).toBeGreaterThanOrEqual(PRODUCTION_HEADERS_TIMEOUT_MILLIS - 100)
        expect(lastCut).toBeLessThan(2 * PRODUCTION_HEADERS_TIMEOUT_MILLIS + openMillis)
        const after = await fetch(`${gatewayProcess.url}/v1/pets?limit=1`, { headers: { authorization: `Bearer ${realKey}` } })
        expect(after.status).toBe(200)
        recordScenario(printedInSoak({
          area: 'Load',
          scenario: `${IDLE_CONNECTIONS} idle connections on one gateway process (half silent, half quiet after one keep-alive request; opened in ${(openMillis / 1000).toFixed(1)} s), held ${(heldMillis / 1000).toFixed(1)} s while 4 real clients call it`,
          answered: `${latencies.length} real requests, all 200, p50 ${Math.round(percentile(latencies, 50))} ms, p99 ${Math.round(percentile(latencies, 99))} ms, max ${Math.round(maxOf(latencies))} ms; each silent connection got 408 and was closed between ${(firstCut / 1000).toFixed(1)} s and ${(lastCut / 1000).toFixed(1)} s (headers timeout 10 s)`,
          lost: `nothing: ${keptOpen} of ${half} keep-alive connections still open at the end of the hold, no real request refused or slower than the 10 s bound`,
          test: TEST,
        }))
      },
      scaled(60_000, 120_000),
    )
  })
})
