import net from 'node:net'
import { Agent } from 'undici'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { BASE_RESERVED_FDS, OPS_MAX_CONNECTIONS } from '../../common/src/http/connectionCap.ts'
import { DEFAULT_POOL_SIZE } from '../../common/src/env.ts'
import { UPSTREAM_CONNECTIONS } from '../../gateway/src/proxy/upstreamProxy.ts'
import { createKey } from '../helpers/loadTools.ts'
import { openRaw, parseAnswer, type RawConnection } from '../helpers/rawClient.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { OPS_TEST_TOKEN, startGatewayProcess, type GatewayProcess } from '../ops/gatewayProcess.ts'
import { baseEnv, freePort, killAll, startNode, waitForReady, type NodeProcess } from '../scripts/processes.ts'

const TEST = 'test/reliability/connectionFlood.int.test.ts'
/** Low enough that a flood of a few hundred sockets would take every descriptor the gateway has. */
const OPEN_FILE_LIMIT = 512
/** What the gateway keeps for itself: its pool, the LISTEN connection, the pets upstream's pool, the ops port, the rest. */
const RESERVED = BASE_RESERVED_FDS + OPS_MAX_CONNECTIONS + DEFAULT_POOL_SIZE + 1 + UPSTREAM_CONNECTIONS
const EXPECTED_CAP = OPEN_FILE_LIMIT - RESERVED
/** Connections real clients hold before the flood, as a load balancer's or a client's pool does. */
const CLIENTS = 16
const FLOOD = OPEN_FILE_LIMIT

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/** Opens `count` connections that send nothing; resolves once each is connected or refused. */
async function flood(port: number, count: number): Promise<{ sockets: net.Socket[]; closedByServer: () => number }> {
  const sockets: net.Socket[] = []
  let closed = 0
  await Promise.all(
    Array.from({ length: count }, () =>
      new Promise<void>((resolve) => {
        const socket = net.connect(port, '127.0.0.1')
        sockets.push(socket)
        socket.once('connect', () => resolve())
        socket.once('error', () => resolve())
        socket.once('close', () => closed++)
      }),
    ),
  )
  return { sockets, closedByServer: () => closed }
}

/** Polls until `done` holds; fails the test at the deadline instead of guessing how long the gateway needs. */
async function until(done: () => boolean | Promise<boolean>, timeoutMillis: number): Promise<void> {
  const deadline = performance.now() + timeoutMillis
  while (!(await done())) {
    if (performance.now() > deadline) throw new Error(`not done within ${timeoutMillis} ms`)
    await sleep(20)
  }
}

/** GET over a connection of its own (not the test's pooled ones): the status, or the error that ended it. */
async function onNewConnection(url: string, key?: string): Promise<{ status?: number; text?: string; error?: string }> {
  const agent = new Agent()
  try {
    const headers = key === undefined ? {} : { authorization: `Bearer ${key}` }
    const response = await fetch(url, { headers, dispatcher: agent, signal: AbortSignal.timeout(5_000) } as unknown as RequestInit)
    return { status: response.status, text: await response.text() }
  } catch (error) {
    return { error: String((error as { cause?: { code?: string } }).cause?.code ?? error) }
  } finally {
    await agent.close()
  }
}

function sample(metrics: string, name: string, labels: string): number | undefined {
  const line = metrics.split('\n').find((candidate) => candidate.startsWith(`${name}{${labels}}`))
  return line === undefined ? undefined : Number(line.split(' ').at(-1))
}

describe('a connection flood on a gateway process under a low open-file limit', () => {
  const database = suiteDatabase()
  let pets: NodeProcess
  let petsUrl: string
  let gateway: GatewayProcess & { cleanup(): void }
  const held: net.Socket[] = []
  const clients: RawConnection[] = []

  beforeAll(async () => {
    const [petsPort, petsOps] = [await freePort(), await freePort()]
    pets = startNode('pets-service/src/main.ts', {
      ...baseEnv(),
      DATABASE_URL: database.url,
      INTERNAL_TOKEN: OPS_TEST_TOKEN,
      PETS_PORT: String(petsPort),
      PETS_OPS_PORT: String(petsOps),
    })
    await waitForReady(`http://127.0.0.1:${petsOps}/readyz`, pets, 60_000)
    petsUrl = `http://127.0.0.1:${petsPort}`
    gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl, openFileLimit: OPEN_FILE_LIMIT, readyTimeoutMillis: 60_000 })
  })
  afterAll(async () => {
    for (const socket of held) socket.destroy()
    for (const client of clients) client.socket.destroy()
    await killAll()
    gateway?.cleanup()
  })

  it(
    'holds the flood at its connection cap: real clients on their connections get 200 with keys looked up in Postgres, and the ops port answers',
    async () => {
      // Keys the gateway has never seen: each request must reach Postgres, then the pets-service.
      const keys = await Promise.all(Array.from({ length: CLIENTS }, async () => (await createKey(database.url, { plan: 'free' })).key))
      clients.push(...(await Promise.all(keys.map(() => openRaw(gateway.url)))))

      const { sockets, closedByServer } = await flood(gateway.apiPort, FLOOD)
      held.push(...sockets)
      // The gateway has accepted the whole flood, and closed what is past its cap, before the real clients speak.
      const pastTheCap = FLOOD + CLIENTS - EXPECTED_CAP
      await until(() => closedByServer() >= pastTheCap, 20_000)

      for (const [index, client] of clients.entries()) {
        client.socket.write(`GET /v1/pets?limit=1 HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer ${keys[index]}\r\n\r\n`)
      }
      const deadline = performance.now() + 10_000
      while (clients.some((client) => !client.answer().includes('\r\n\r\n') && !client.isClosed()) && performance.now() < deadline) await sleep(20)
      const statuses = clients.map((client) => parseAnswer(client.answer()).statusLine)
      expect(statuses).toEqual(clients.map(() => 'HTTP/1.1 200 OK'))

      // Probes and scrapes open connections of their own, and get them.
      const health = await onNewConnection(`${gateway.opsUrl}/healthz`)
      expect(health.status).toBe(200)
      const ready = await onNewConnection(`${gateway.opsUrl}/readyz`)
      expect(ready.status).toBe(200)
      const scrape = await onNewConnection(`${gateway.opsUrl}/metrics`)
      expect(scrape.status).toBe(200)
      const metrics = scrape.text ?? ''
      expect(sample(metrics, 'http_connections', 'listener="public",state="max"')).toBe(EXPECTED_CAP)
      expect(sample(metrics, 'http_connections', 'listener="public",state="open"')).toBe(EXPECTED_CAP)
      const refused = sample(metrics, 'http_connections_refused_total', 'listener="public"') ?? 0
      // The flood beyond the cap was closed as it came in, and the counter saw each.
      expect(refused).toBe(pastTheCap)
      expect(closedByServer()).toBe(refused)

      // A new client connection while the cap is held is closed without an answer (its client
      // retries, or its load balancer tries another gateway), and is counted.
      const turnedAway = await onNewConnection(`${gateway.url}/v1/pets?limit=1`)
      expect(turnedAway.status).toBeUndefined()
      expect(gateway.proc.hasExited()).toBe(false)

      // Once the flood lets go, new connections are served again.
      for (const socket of held) socket.destroy()
      let after: Awaited<ReturnType<typeof onNewConnection>> = {}
      await until(async () => (after = await onNewConnection(`${gateway.url}/v1/pets?limit=1`, keys[0])).status !== undefined, 20_000)
      expect(after.status).toBe(200)
      recordScenario({
        area: 'Load',
        scenario: `${FLOOD} idle connections at once on a gateway process whose open-file limit is ${OPEN_FILE_LIMIT}, while ${CLIENTS} clients on connections they held send keys not yet cached`,
        answered: `${CLIENTS} × 200 (each key looked up in Postgres, each request passed to the pets-service); /healthz, /readyz and /metrics 200 on new connections; the gateway held ${EXPECTED_CAP} connections (its cap: the limit less ${RESERVED} kept for Postgres, the upstream and the ops port) and closed the other ${refused} as they came`,
        lost: 'nothing: no descriptor ran out (no 500 or 502), the process kept running, and new connections were served once the flood closed',
        test: TEST,
      })
    },
    60_000,
  )
})
