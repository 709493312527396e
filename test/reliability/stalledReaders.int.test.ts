import { readFileSync } from 'node:fs'
import net from 'node:net'
import { describe, expect, it } from 'vitest'
import { CLIENT_TIMEOUTS } from '../../common/src/http/clientErrors.ts'
import { scriptedUpstream } from '../helpers/fakeUpstreams.ts'
import { startGateway } from '../helpers/gateway.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { printedInSoak } from '../helpers/soak.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

const TEST = 'test/reliability/stalledReaders.int.test.ts'
/** Shorter than the production 60 s, so the cut comes within seconds. */
const TIMEOUTS = { ...CLIENT_TIMEOUTS, headersTimeoutMillis: 2_000, requestTimeoutMillis: 4_000, stalledMillis: 1_000 }
/** The catalogue answers after two and a half times that: it is at work, not stalled. */
const UPSTREAM_DELAY_MILLIS = 2_500
const BUNDLE = '/docs/swagger-ui-bundle.js'

/**
 * The kernel's sockets from `localPort` on 127.0.0.1 to `remotePort` (Linux's /proc/net/tcp), with
 * their state and the bytes queued to send; undefined where there is no such table.
 */
function gatewayEnds(localPort: number, remotePort: number): { state: string; queued: number }[] | undefined {
  let table: string
  try {
    table = readFileSync('/proc/net/tcp', 'utf8')
  } catch {
    return undefined
  }
  const hexPort = (port: number) => port.toString(16).toUpperCase().padStart(4, '0')
  return table
    .split('\n')
    .slice(1)
    .map((line) => line.trim().split(/\s+/))
    .filter(([, local, remote]) => local === `0100007F:${hexPort(localPort)}` && remote === `0100007F:${hexPort(remotePort)}`)
    .map(([, , , state, queues]) => ({ state: state!, queued: parseInt(queues!.split(':')[0]!, 16) }))
}

describe('connections on which nothing moves', () => {
  const database = suiteDatabase()
  const upstream = suiteService(() =>
    scriptedUpstream((_request, response) => {
      setTimeout(() => response.setHeader('content-type', 'application/json').end('[]'), UPSTREAM_DELAY_MILLIS)
    }),
  )
  const gateway = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: upstream.url, clientTimeouts: TIMEOUTS }))

  it('resets a connection whose client stops reading its answers, so neither the gateway nor its kernel keeps what was queued', async () => {
    const { hostname, port } = new URL(gateway.url)
    const accepted = new Promise<net.Socket>((resolve) => gateway.app.server.once('connection', resolve))
    const socket = net.connect(Number(port), hostname)
    await new Promise((resolve) => socket.once('connect', resolve))
    const gatewaySide = await accepted
    const opened = performance.now()
    socket.pause()
    socket.write(`GET ${BUNDLE} HTTP/1.1\r\nHost: gateway\r\n\r\n`.repeat(20))
    const closedAt = new Promise<number>((resolve) => socket.once('close', () => resolve(performance.now() - opened)))
    // One to two times the timeout (Node lets a write that was still going out run one more).
    const gatewayLetGo = new Promise<number>((resolve) => gatewaySide.once('close', () => resolve(performance.now() - opened)))
    const cutAfter = await gatewayLetGo
    expect(cutAfter).toBeGreaterThanOrEqual(TIMEOUTS.stalledMillis - 100)
    // Closed the usual way, the kernel would keep the gateway's end (FIN-WAIT-1) with the
    // megabytes queued in it, for as long as the client does not read: reset, it is gone.
    const ends = gatewayEnds(Number(port), socket.localPort!)
    if (ends !== undefined) expect(ends, 'the gateway end the kernel keeps').toEqual([])
    // Reading now, the client gets what its own kernel had received, then the end of it: not
    // what the gateway's kernel still held.
    let received = 0
    socket.on('data', (chunk: Buffer) => (received += chunk.length))
    const outcome = new Promise<string>((resolve) => {
      socket.once('error', () => resolve('closed'))
      socket.once('end', () => resolve('closed'))
      setTimeout(() => resolve('still open'), 10_000).unref()
    })
    socket.resume()
    expect(await outcome).toBe('closed')
    expect(received).toBeLessThan(gatewaySide.bytesWritten)
    const closedAfter = await closedAt
    socket.destroy()
    // And the gateway serves the next client.
    expect((await gateway.request(BUNDLE, { contract: false })).status).toBe(200)
    recordScenario(printedInSoak({
      area: 'Hostile input',
      scenario: `A client that asks for the docs bundle 20 times on one connection and reads nothing (stalled timeout set to ${TIMEOUTS.stalledMillis} ms; 60 s in production)`,
      answered: `the connection reset (RST) after ${Math.round(cutAfter)} ms: neither the gateway nor its kernel kept its end; the client, reading afterwards, got ${received} of the ${gatewaySide.bytesWritten} bytes the gateway had written, then the end (closed after ${Math.round(closedAfter)} ms); the next client got 200`,
      lost: 'nothing: the kernel dropped the queued answer with the connection instead of holding it for minutes',
      test: TEST,
    }))
  })

  it('keeps a connection on which nothing moves while its request is still being answered: a catalogue slower than the timeout still answers', async () => {
    const { key } = await gateway.createKey({ plan: 'enterprise', perMinute: 100_000, perDay: 1_000_000 })
    const started = performance.now()
    const response = await gateway.request('/v1/pets', { key, contract: false })
    expect(response.status).toBe(200)
    expect(await response.json()).toEqual([])
    expect(performance.now() - started).toBeGreaterThanOrEqual(UPSTREAM_DELAY_MILLIS - 100)
  })
})
