import net from 'node:net'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { eventually } from '../gateway/rateLimit/httpLimits.ts'
import { baseEnv, exitWithin, freePort, killAll, startNode, waitForOutput, waitForReady, type NodeProcess } from '../scripts/processes.ts'
import { OPS_TEST_TOKEN, gatewayProcessEnv } from './gatewayProcess.ts'

/** What the ops port answers: the status of /healthz and /readyz and /readyz's body, or the connection error. */
async function probe(opsPort: number, path: '/healthz' | '/readyz') {
  try {
    const response = await fetch(`http://127.0.0.1:${opsPort}${path}`, { signal: AbortSignal.timeout(3_000) })
    return { status: response.status, body: (await response.json()) as Record<string, unknown> }
  } catch (error) {
    return { status: 0, body: { error: (error as Error & { cause?: { code?: string } }).cause?.code ?? String(error) } }
  }
}

describe('starting before Postgres, and signals at the edges of a process life', () => {
  const database = suiteDatabase()
  let upstream: TestUpstream

  beforeAll(async () => {
    upstream = await recordingUpstream()
  })
  afterEach(killAll)
  afterAll(async () => {
    await upstream?.close()
  })

  const gatewayEnv = (databaseUrl: string, extra: NodeJS.ProcessEnv = {}) => gatewayProcessEnv({ databaseUrl, petsUrl: upstream.url, extra })

  async function petsEnv(databaseUrl: string) {
    const opsPort = await freePort()
    const env = {
      ...baseEnv(),
      DATABASE_URL: databaseUrl,
      INTERNAL_TOKEN: OPS_TEST_TOKEN,
      PETS_HOST: '127.0.0.1',
      PETS_PORT: String(await freePort()),
      PETS_OPS_HOST: '127.0.0.1',
      PETS_OPS_PORT: String(opsPort),
    }
    return { env, opsPort }
  }

  /** A service started with its Postgres behind a cut relay, once it says it waits for Postgres. */
  async function waitingForPostgres(
    script: string,
    envFor: (databaseUrl: string) => Promise<{ env: NodeJS.ProcessEnv; opsPort: number }>,
    extra: NodeJS.ProcessEnv = {},
  ) {
    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    await relay.cut()
    const unreachable = new URL(database.url)
    unreachable.host = `127.0.0.1:${relay.port}`
    const { env, opsPort } = await envFor(unreachable.toString())
    const service = startNode(script, { ...env, ...extra })
    try {
      await waitForOutput(service, 'waiting for Postgres at DATABASE_URL', 30_000)
    } catch (error) {
      await relay.close()
      throw error
    }
    return { relay, service, opsPort }
  }

  it.each([
    ['gateway', 'gateway/src/main.ts', gatewayEnv],
    ['pets-service', 'pets-service/src/main.ts', petsEnv],
  ] as const)('a %s started while Postgres is unreachable waits for it, alive and not ready, and becomes ready once it appears', async (_service, script, envFor) => {
    const { relay, service, opsPort } = await waitingForPostgres(script, envFor)
    try {
      await eventually(async () => (await probe(opsPort, '/healthz')).status === 200, 10_000)
      expect(await probe(opsPort, '/readyz')).toMatchObject({ status: 503, body: { status: 'starting', dependencies: { postgres: 'down' } } })
      expect(service.hasExited()).toBe(false)

      await relay.restore()
      await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, service, 30_000)
      expect(await probe(opsPort, '/readyz')).toMatchObject({ status: 200, body: { status: 'ready' } })
    } finally {
      await relay.close()
    }
  }, 90_000)

  // As PID 1 in a container without an init process, a signal the process has no handler for is
  // dropped: without one, `docker stop` waited out its grace period. Here the handler shows as exit
  // code 0 instead of a death by the signal.
  it.each([
    ['gateway', 'gateway/src/main.ts', gatewayEnv],
    ['pets-service', 'pets-service/src/main.ts', petsEnv],
  ] as const)('a %s still waiting for Postgres stops at once on SIGTERM, by its own handler', async (_service, script, envFor) => {
    const { relay, service } = await waitingForPostgres(script, envFor, { LOG_LEVEL: 'info' })
    try {
      service.child.kill('SIGTERM')
      expect(await exitWithin(service, 5_000)).toEqual({ code: 0, signal: null })
      expect(service.output()).toContain('stopped while starting')
    } finally {
      await relay.close()
    }
  }, 60_000)

  it('a gateway whose Postgres refuses it for good (no such database) exits 1 at once, naming Postgres', async () => {
    const missing = new URL(database.url)
    missing.pathname = '/no_such_database_for_this_test'
    const { env } = await gatewayEnv(missing.toString())
    const gateway = startNode('gateway/src/main.ts', env)
    expect(await exitWithin(gateway, 30_000)).toEqual({ code: 1, signal: null })
    expect(gateway.output()).toContain('cannot use Postgres at DATABASE_URL: 3D000')
  }, 40_000)

  it('a gateway whose Redis cannot be reached at start says why in its warning (the connection refused, say)', async () => {
    const port = await freePort()
    const { env, opsPort } = await gatewayEnv(database.url, { REDIS_URL: `redis://127.0.0.1:${port}` })
    const gateway = startNode('gateway/src/main.ts', env)
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
    // Log lines leave in batches: the warning may reach stdout a moment after /readyz says ready.
    const warningLine = () => gateway.output().split('\n').find((line) => line.includes('Redis is not reachable yet'))
    await eventually(async () => warningLine() !== undefined, 5_000)
    const warning = warningLine()
    expect(warning).toContain(`: connect ECONNREFUSED 127.0.0.1:${port}"`)
    expect(warning).toMatch(/"problem":"Redis is not connected \(\w+\): /)
  }, 40_000)

  it('a SIGHUP (config reload) that reaches a gateway still starting is held, not fatal', async () => {
    // A Redis that accepts connections and answers nothing: the gateway waits for it (up to 2 s)
    // inside its start-up, which is when the reload signal arrives.
    const sockets: net.Socket[] = []
    let connected = () => undefined as void
    const firstConnection = new Promise<void>((resolve) => (connected = resolve))
    const mute = net.createServer((socket) => {
      sockets.push(socket)
      connected()
    })
    await new Promise<void>((resolve) => mute.listen(0, '127.0.0.1', resolve))
    const { env, opsPort } = await gatewayEnv(database.url, { REDIS_URL: `redis://127.0.0.1:${(mute.address() as net.AddressInfo).port}` })
    const gateway = startNode('gateway/src/main.ts', env)
    try {
      await firstConnection
      gateway.child.kill('SIGHUP')
      await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
      expect(gateway.hasExited()).toBe(false)
    } finally {
      for (const socket of sockets) socket.destroy()
      mute.close()
    }
  }, 40_000)

  async function readyGateway(extra: NodeJS.ProcessEnv): Promise<NodeProcess> {
    const { env, opsPort } = await gatewayEnv(database.url, extra)
    const gateway = startNode('gateway/src/main.ts', env)
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
    return gateway
  }

  it('a second SIGTERM during the drain forces the exit with code 1, saying so', async () => {
    const gateway = await readyGateway({ SHUTDOWN_DRAIN_SECONDS: '5', LOG_LEVEL: 'info' })
    gateway.child.kill('SIGTERM')
    await waitForOutput(gateway, 'shutting down', 10_000)
    gateway.child.kill('SIGTERM')
    expect(await exitWithin(gateway, 10_000)).toEqual({ code: 1, signal: null })
    expect(gateway.output()).toContain('second signal, exiting now')
  }, 60_000)

  it('SIGHUPs that keep arriving through a shutdown (a config reloader) leave it clean: exit 0', async () => {
    const gateway = await readyGateway({ SHUTDOWN_DRAIN_SECONDS: '1' })
    gateway.child.kill('SIGTERM')
    const reloads = setInterval(() => gateway.hasExited() || gateway.child.kill('SIGHUP'), 5)
    try {
      expect(await exitWithin(gateway, 20_000)).toEqual({ code: 0, signal: null })
    } finally {
      clearInterval(reloads)
    }
  }, 60_000)
})
