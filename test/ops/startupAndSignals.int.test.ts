import { createHash, randomBytes } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import type { Redis } from 'ioredis'
import pg from 'pg'
import { parse, stringify } from 'yaml'
import { afterAll, beforeAll, describe, expect, inject, it, type TestContext } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { limitKey } from '../../gateway/src/rateLimit/limitStore.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { startPrivateRedis, type PrivateRedis } from '../helpers/redisServer.ts'
import { TEST_DATABASE_PREFIX, dropDatabases } from '../helpers/postgres.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { relayTo } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { turns } from '../helpers/turns.ts'
import { eventually, sleep } from '../gateway/rateLimit/httpLimits.ts'
import { baseEnv, exitWithin, freePort, killAll, startNode, waitForOutput, waitForReady, type NodeProcess } from '../scripts/processes.ts'
import { OPS_TEST_TOKEN, gatewayProcessEnv } from './gatewayProcess.ts'

/** Two processes at work at once (test/helpers/turns.ts); the tests' timeouts leave room for waiting a turn. */
const processTurns = turns(2)

/**
 * startNode once a turn is free, killed (if still running) when the test that started it ends,
 * which gives the turn back. The tests run side by side (each on its own ports, Redis user or
 * database): none may end another's processes.
 */
async function startOwn(context: TestContext, script: string, env: NodeJS.ProcessEnv): Promise<NodeProcess> {
  const giveBack = await processTurns.take()
  const started = startNode(script, env)
  context.onTestFinished(async () => {
    started.kill()
    await started.exited
    giveBack()
  })
  return started
}

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
  /** Databases of one test's own (another encoding than UTF-8, a migration lock of its own), dropped at the end. */
  const ownDatabases: string[] = []
  afterAll(async () => {
    await killAll()
    await upstream?.close()
    await dropDatabases(inject('postgresAdminUrl'), (name) => ownDatabases.includes(name))
  })

  /** A new, empty database for one test, and its URL. */
  async function ownDatabase(tag: string, encoding = 'UTF8'): Promise<{ name: string; url: string }> {
    const name = `${TEST_DATABASE_PREFIX}${inject('testRunId')}_${tag}_${randomBytes(3).toString('hex')}`
    const admin = new pg.Client({ connectionString: inject('postgresAdminUrl') })
    await admin.connect()
    try {
      await admin.query(`CREATE DATABASE "${name}" ENCODING '${encoding}' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'`)
      ownDatabases.push(name)
    } finally {
      await admin.end()
    }
    const url = new URL(inject('postgresAdminUrl'))
    url.pathname = `/${name}`
    return { name, url: url.toString() }
  }

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

  type EnvFor = (databaseUrl: string) => Promise<{ env: NodeJS.ProcessEnv; opsPort: number }>

  /** A service started with its Postgres behind a cut relay, once it says it waits for Postgres. */
  async function waitingForPostgres(
    context: TestContext,
    script: string,
    envFor: EnvFor,
    extra: NodeJS.ProcessEnv = {},
  ) {
    const { relay, url: unreachable } = await relayTo(database.url)
    await relay.cut()
    const { env, opsPort } = await envFor(unreachable)
    const service = await startOwn(context, script, { ...env, ...extra })
    try {
      await waitForOutput(service, 'waiting for Postgres at DATABASE_URL', 30_000)
    } catch (error) {
      await relay.close()
      throw error
    }
    return { relay, service, opsPort }
  }

  const services: [string, string, EnvFor][] = [
    ['gateway', 'gateway/src/main.ts', gatewayEnv],
    ['pets-service', 'pets-service/src/main.ts', petsEnv],
  ]

  it.concurrent.for(services)('a %s started while Postgres is unreachable waits for it, alive and not ready, and becomes ready once it appears', { timeout: 150_000 }, async ([_service, script, envFor], context) => {
    const { relay, service, opsPort } = await waitingForPostgres(context, script, envFor)
    try {
      await eventually(async () => (await probe(opsPort, '/healthz')).status === 200, 10_000)
      expect(await probe(opsPort, '/readyz')).toMatchObject({
        status: 503,
        body: { status: 'starting', dependencies: { postgres: 'down' }, reasons: { postgres: expect.stringMatching(/^no answer from Postgres \(.+\)$/) } },
      })
      expect(service.hasExited()).toBe(false)

      await relay.restore()
      await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, service, 30_000)
      expect(await probe(opsPort, '/readyz')).toMatchObject({ status: 200, body: { status: 'ready' } })
    } finally {
      await relay.close()
    }
  })

  // As PID 1 in a container without an init process, a signal the process has no handler for is
  // dropped: without one, `docker stop` waited out its grace period. Here the handler shows as exit
  // code 0 instead of a death by the signal.
  it.concurrent.for(services)('a %s still waiting for Postgres stops at once on SIGTERM, by its own handler', { timeout: 120_000 }, async ([_service, script, envFor], context) => {
    const { relay, service } = await waitingForPostgres(context, script, envFor, { LOG_LEVEL: 'info' })
    try {
      service.child.kill('SIGTERM')
      expect(await exitWithin(service, 5_000)).toEqual({ code: 0, signal: null })
      expect(service.output()).toContain('stopped while starting')
    } finally {
      await relay.close()
    }
  })

  it.concurrent('a gateway whose Postgres refuses it for good (no such database) exits 1 at once, naming Postgres', async (context) => {
    const missing = new URL(database.url)
    missing.pathname = '/no_such_database_for_this_test'
    const { env } = await gatewayEnv(missing.toString())
    const gateway = await startOwn(context, 'gateway/src/main.ts', env)
    expect(await exitWithin(gateway, 30_000)).toEqual({ code: 1, signal: null })
    expect(gateway.output()).toContain('cannot use Postgres at DATABASE_URL: 3D000')
  }, 100_000)

  // As run alone (a container, a second replica: no npm start to check the ports first), a taken
  // port stopped the service with a stack trace that named no setting, after the ops port and the
  // migrations had gone ahead.
  it.concurrent.for([
    ['gateway', 'gateway/src/main.ts', 'GATEWAY_PORT (server.port)'],
    ['pets-service', 'pets-service/src/main.ts', 'PETS_PORT'],
  ] as const)('a %s whose public port another process holds exits 1, naming the address and the setting to change', { timeout: 100_000 }, async ([service, script, setting], context) => {
    const holder = net.createServer()
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve))
    context.onTestFinished(() => new Promise<void>((resolve) => holder.close(() => resolve())))
    const taken = (holder.address() as net.AddressInfo).port
    const { env } = service === 'gateway' ? await gatewayEnv(database.url) : await petsEnv(database.url)
    const started = await startOwn(context, script, { ...env, [service === 'gateway' ? 'GATEWAY_PORT' : 'PETS_PORT']: String(taken) })
    expect(await exitWithin(started, 30_000)).toEqual({ code: 1, signal: null })
    expect(started.output()).toContain(`${service} cannot start: 127.0.0.1:${taken} is in use by another process: stop it, or set ${setting} to a free port`)
    expect(started.output()).not.toContain('    at ')
  })

  // On such a database a pet named "Rex 🐶" was answered 500 internal_error (LATIN1 cannot encode it;
  // SQL_ASCII counts its bytes against the 100-character CHECK) while "Rex" was stored, and the keys
  // CLI failed on a key name alike.
  it.concurrent.for([
    ['pets-service', 'LATIN1'],
    ['pets-service', 'SQL_ASCII'],
    ['gateway', 'LATIN1'],
  ] as const)('a %s whose database stores text as %s exits 1 at start, naming the encoding and the fix', { timeout: 100_000 }, async ([service, encoding], context) => {
    const { name, url } = await ownDatabase(encoding.toLowerCase(), encoding)
    const { env } = service === 'gateway' ? await gatewayEnv(url) : await petsEnv(url)
    const started = await startOwn(context, service === 'gateway' ? 'gateway/src/main.ts' : 'pets-service/src/main.ts', env)
    expect(await exitWithin(started, 30_000)).toEqual({ code: 1, signal: null })
    expect(started.output()).toContain(`${service} cannot start: cannot use Postgres at DATABASE_URL: the database "${name}" stores text as ${encoding}`)
    expect(started.output()).toContain("ENCODING 'UTF8'")
  })

  // A failover to a host that is gone, as the service starts: waitForPostgres was answered, then the
  // connection migrating goes mute. Left waiting, the process neither started nor exited, and its
  // supervisor saw nothing to restart.
  // On a database of its own: the other tests' pets-services, started side by side on the shared
  // one, waited on the lock the test holds, and were taken for the one it waits for.
  it.concurrent('a pets-service whose Postgres goes mute while it migrates exits 1 within 30 s, saying so, for its supervisor to restart it', async (context) => {
    const own = await ownDatabase('mute')
    const holder = new pg.Client({ connectionString: own.url })
    await holder.connect()
    // Another instance migrating: the start waits on the lock, on a connection the test then silences.
    const lock = createHash('sha256').update(`migrations:${PETS_MIGRATIONS.schema}`).digest().readBigInt64BE(0).toString()
    await holder.query('SELECT pg_advisory_lock($1::bigint)', [lock])
    const { relay, url: viaRelay } = await relayTo(own.url)
    try {
      const { env } = await petsEnv(viaRelay)
      const service = await startOwn(context, 'pets-service/src/main.ts', env)
      const waitingOnTheLock = async () => {
        const { rows } = await holder.query<{ waiting: number }>(
          `SELECT count(*)::int AS waiting FROM pg_stat_activity
            WHERE datname = current_database() AND application_name = 'pets-service' AND wait_event_type = 'Lock'`,
        )
        return rows[0]!.waiting > 0
      }
      await eventually(waitingOnTheLock, 30_000)
      await relay.silence()
      const silenced = performance.now()
      expect(await exitWithin(service, 30_000)).toEqual({ code: 1, signal: null })
      const exitedMillis = Math.round(performance.now() - silenced)
      expect(service.output()).toContain('Postgres stopped answering on the migration connection')
      recordScenario({
        area: 'Postgres',
        scenario: "a pets-service's Postgres goes mute while it migrates at start (waiting for another instance's migration lock)",
        answered: `exit 1 ${exitedMillis} ms after the connection went mute (bound asserted 30000 ms), logging 'Postgres stopped answering on the migration connection (…)', for its supervisor to restart it`,
        lost: 'nothing: no migration had begun; each runs in a transaction of its own',
        test: 'test/ops/startupAndSignals.int.test.ts',
      })
    } finally {
      await relay.close()
      await holder.end()
    }
  }, 150_000)

  it.concurrent('a gateway whose Redis cannot be reached at start says why in its warning (the connection refused, say)', async (context) => {
    const port = await freePort()
    const { env, opsPort } = await gatewayEnv(database.url, { REDIS_URL: `redis://127.0.0.1:${port}` })
    const gateway = await startOwn(context, 'gateway/src/main.ts', env)
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
    // Log lines leave in batches: the warning may reach stdout a moment after /readyz says ready.
    const warningLine = () => gateway.output().split('\n').find((line) => line.includes('Redis is not reachable yet'))
    await eventually(async () => warningLine() !== undefined, 5_000)
    const warning = warningLine()
    expect(warning).toContain(`: connect ECONNREFUSED 127.0.0.1:${port}"`)
    expect(warning).toMatch(/"problem":"Redis is not connected \(\w+\): /)
  }, 100_000)

  it.concurrent('a gateway whose Redis evicts keys when full (maxmemory with volatile-lru, ElastiCache\'s default) warns at start, naming the policy and noeviction; on noeviction it does not', async (context) => {
    const redis = await startPrivateRedis()
    const admin = redis.admin()
    try {
      await admin.connect()
      await admin.config('SET', 'maxmemory', '100mb')
      await admin.config('SET', 'maxmemory-policy', 'volatile-lru')
      const startedOn = async () => {
        const { env, opsPort, apiPort } = await gatewayEnv(database.url, { REDIS_URL: redis.url })
        const gateway = await startOwn(context, 'gateway/src/main.ts', { ...env, LOG_LEVEL: 'info' })
        await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
        // Start-up lines come before the first request's access line, though they may reach stdout after /readyz.
        expect((await fetch(`http://127.0.0.1:${apiPort}/v1/pets`)).status).toBe(401)
        await eventually(async () => gateway.output().includes('"status":401'), 5_000)
        return gateway.output().split('\n').filter((line) => line.includes('evicts keys when full'))
      }
      const [warning, ...more] = await startedOn()
      expect(more).toEqual([])
      expect(JSON.parse(warning!)).toMatchObject({
        level: 40,
        maxmemoryPolicy: ['volatile-lru'],
        msg: expect.stringMatching(/^Redis at REDIS_URL evicts keys when full \(maxmemory-policy volatile-lru\): counts, strikes and bans then vanish, .* set maxmemory-policy noeviction/),
      })
      await admin.config('SET', 'maxmemory-policy', 'noeviction')
      expect(await startedOn()).toEqual([])
    } finally {
      admin.disconnect()
      await redis.close()
    }
  }, 100_000)

  it.concurrent('a pets-service given SIGHUP (a reload sent to every service) goes on serving, saying it has nothing to reload', async (context) => {
    const { env, opsPort } = await petsEnv(database.url)
    const pets = await startOwn(context, 'pets-service/src/main.ts', { ...env, LOG_LEVEL: 'info' })
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, pets, 30_000)
    process.kill(pets.pid, 'SIGHUP')
    await waitForOutput(pets, 'SIGHUP: the pets-service has no config to reload; it goes on serving', 5_000)
    expect(await probe(opsPort, '/readyz')).toMatchObject({ status: 200, body: { status: 'ready' } })
    expect(pets.hasExited()).toBe(false)
  }, 100_000)

  it.concurrent('a SIGHUP (config reload) that reaches a gateway still starting is held, not fatal', async (context) => {
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
    const gateway = await startOwn(context, 'gateway/src/main.ts', env)
    try {
      await firstConnection
      gateway.child.kill('SIGHUP')
      await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
      expect(gateway.hasExited()).toBe(false)
    } finally {
      for (const socket of sockets) socket.destroy()
      mute.close()
    }
  }, 100_000)

  async function readyGateway(context: TestContext, extra: NodeJS.ProcessEnv): Promise<NodeProcess> {
    const { env, opsPort } = await gatewayEnv(database.url, extra)
    const gateway = await startOwn(context, 'gateway/src/main.ts', env)
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
    return gateway
  }

  it.concurrent('a second SIGTERM during the drain forces the exit with code 1, saying so', async (context) => {
    const gateway = await readyGateway(context, { SHUTDOWN_DRAIN_SECONDS: '5', LOG_LEVEL: 'info' })
    gateway.child.kill('SIGTERM')
    await waitForOutput(gateway, 'shutting down', 10_000)
    gateway.child.kill('SIGTERM')
    expect(await exitWithin(gateway, 10_000)).toEqual({ code: 1, signal: null })
    expect(gateway.output()).toContain('second signal, exiting now')
  }, 120_000)

  it.concurrent('SIGHUPs that keep arriving through a shutdown (a config reloader) leave it clean: exit 0', async (context) => {
    const gateway = await readyGateway(context, { SHUTDOWN_DRAIN_SECONDS: '1' })
    gateway.child.kill('SIGTERM')
    const reloads = setInterval(() => gateway.hasExited() || gateway.child.kill('SIGHUP'), 5)
    try {
      expect(await exitWithin(gateway, 20_000)).toEqual({ code: 0, signal: null })
    } finally {
      clearInterval(reloads)
    }
  }, 120_000)

  describe('a Redis that refuses the gateway\'s credentials (requirepass)', () => {
    const PASSWORD = 'Req-S3cr3t-p4ss'
    let redis: PrivateRedis
    let admin: Redis

    beforeAll(async () => {
      redis = await startPrivateRedis()
      admin = redis.admin()
      await admin.connect()
      // The admin connection stays logged in: Redis asks new connections only.
      await admin.config('SET', 'requirepass', PASSWORD)
    })
    afterAll(async () => {
      admin?.disconnect()
      await redis?.close()
    })

    it.concurrent.for([
      ['a wrong password in REDIS_URL', () => ({ REDIS_URL: `redis://:wrong-S3cr3t@127.0.0.1:${redis.port}` }), 'WRONGPASS invalid username-password pair'],
      ['a wrong REDIS_PASSWORD', () => ({ REDIS_URL: redis.url, REDIS_PASSWORD: 'wrong-S3cr3t' }), 'WRONGPASS invalid username-password pair'],
      ['no password at all', () => ({ REDIS_URL: redis.url }), 'NOAUTH Authentication required.'],
    ] as const)('at start (%s): the gateway exits 1, naming REDIS_URL and Redis\'s refusal, instead of running on per-process limits', { timeout: 100_000 }, async ([_case, credentials, refusal], context) => {
      const { env, apiPort } = await gatewayEnv(database.url, credentials())
      const gateway = await startOwn(context, 'gateway/src/main.ts', env)
      expect(await exitWithin(gateway, 30_000)).toEqual({ code: 1, signal: null })
      const output = gateway.output()
      expect(output).toContain(`gateway cannot start: cannot use Redis at REDIS_URL: it refuses the gateway's credentials (${refusal}`)
      // The refusal is the one fatal line, not also a line saying limits follow onStoreFailure.
      expect(output).not.toContain('limits follow onStoreFailure')
      expect(output).not.toContain('wrong-S3cr3t')
      expect(output).not.toContain(PASSWORD)
      // It never served: the public port was not opened.
      await expect(fetch(`http://127.0.0.1:${apiPort}/v1/pets`)).rejects.toThrow()
    })

    it('while running (the password changed under it): one error line naming the refusal, 503 and /readyz with closed, no exit; ready again once Redis accepts it', async (context) => {
      const { env, opsPort, apiPort } = await gatewayEnv(database.url, { REDIS_URL: `redis://:${PASSWORD}@127.0.0.1:${redis.port}` })
      const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-redis-auth-'))
      try {
        const configPath = path.join(directory, 'gateway.yaml')
        writeFileSync(configPath, readFileSync('config/gateway.yaml', 'utf8').replace(/^onStoreFailure: open/m, 'onStoreFailure: closed'))
        const gateway = await startOwn(context, 'gateway/src/main.ts', { ...env, GATEWAY_CONFIG: configPath, LOG_LEVEL: 'info' })
        await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
        expect(await probe(opsPort, '/readyz')).toMatchObject({ status: 200, body: { dependencies: { redis: 'up' } } })

        await admin.config('SET', 'requirepass', 'Rotated-S3cr3t')
        await admin.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
        const refusals = () => gateway.output().split('\n').filter((line) => line.includes("Redis refuses the gateway's credentials"))
        await eventually(async () => refusals().length > 0, 10_000)
        expect(refusals()[0]).toContain('"level":50')
        expect(refusals()[0]).toContain('WRONGPASS invalid username-password pair')
        expect(refusals()[0]).toContain('fix REDIS_URL')
        const readyz = await probe(opsPort, '/readyz')
        expect(readyz).toMatchObject({ status: 503, body: { status: 'not_ready', dependencies: { redis: 'down' } } })
        expect(JSON.stringify(readyz.body)).toContain('WRONGPASS')
        const pool = createPool({ connectionString: database.url, applicationName: 'redis-auth-test' })
        try {
          const { key } = await createKeyRepository(pool).create({ name: 'redis-auth', plan: 'free' })
          const refused = await fetch(`http://127.0.0.1:${apiPort}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
          expect(refused.status).toBe(503)
          expect(((await refused.json()) as { code: string }).code).toBe('service_unavailable')
        } finally {
          await pool.end()
        }
        // The client reconnects about once a second, each time refused: still one line, and no exit.
        await sleep(3_000)
        expect(refusals()).toHaveLength(1)
        expect(gateway.hasExited()).toBe(false)

        await admin.config('SET', 'requirepass', PASSWORD)
        await eventually(async () => (await probe(opsPort, '/readyz')).status === 200, 10_000)
        await eventually(async () => gateway.output().includes("Redis accepts the gateway's credentials again"), 5_000)
        expect(gateway.output()).not.toContain('Rotated-S3cr3t')
      } finally {
        await admin.config('SET', 'requirepass', PASSWORD)
        rmSync(directory, { recursive: true, force: true })
      }
    }, 60_000)
  })

  // An ACL user that logs in but lacks a command or key pattern the gateway needs: started anyway,
  // every decision failed in Redis, for good (per-process limits with open, 503 with closed).
  describe('a Redis whose ACL user logs in but lacks a permission the gateway needs', () => {
    const PASSWORD = 'Acl-S3cr3t-7k3m'
    // README, Redis ACL: the least a gateway user needs.
    const README_ACL = ['resetkeys', '~rl:*', '~anon:*', 'resetchannels', '-@all', '+evalsha', '+eval', '+time', '+get', '+set', '+pttl', '+incrby', '+expire', '+info', '+select']
    let redis: PrivateRedis
    let admin: Redis
    let directory: string
    /**
     * Redis calls within a budget a loaded machine meets (redis.commandTimeoutMillis): one past the
     * 50 ms default is no refusal, and the start-up check cannot tell. Several start at once here.
     */
    let patientConfig: string

    beforeAll(async () => {
      redis = await startPrivateRedis()
      admin = redis.admin()
      await admin.connect()
      directory = mkdtempSync(path.join(os.tmpdir(), 'aas-redis-acl-'))
      patientConfig = path.join(directory, 'gateway.yaml')
      const file = parse(readFileSync('config/gateway.yaml', 'utf8')) as GatewayConfigFile
      file.redis.commandTimeoutMillis = 1_000
      writeFileSync(patientConfig, stringify(file))
    })
    afterAll(async () => {
      admin?.disconnect()
      await redis?.close()
      if (directory) rmSync(directory, { recursive: true, force: true })
    })

    async function userWith(name: string, rules: string[], database = ''): Promise<NodeJS.ProcessEnv> {
      await admin.call('ACL', 'SETUSER', name, 'reset', 'on', `>${PASSWORD}`, ...rules)
      return { REDIS_URL: `${redis.url}${database}`, REDIS_USERNAME: name, REDIS_PASSWORD: PASSWORD }
    }

    // Each case its own ACL user, as the cases run side by side.
    it.concurrent.for([
      ['no +evalsha', README_ACL.filter((rule) => rule !== '+evalsha'), "NOPERM this user has no permissions to run the 'evalsha' command"],
      ['no +time (run inside the script)', README_ACL.filter((rule) => rule !== '+time'), "ERR The user executing the script can't run this command"],
      ['no +incrby (the per-IP count of guesses)', README_ACL.filter((rule) => rule !== '+incrby'), "ERR The user executing the script can't run this command"],
      ['keys ~other:* instead of ~rl:* ~anon:*', README_ACL.filter((rule) => !rule.startsWith('~')).concat('~other:*'), 'NOPERM this user has no permissions to access one of the keys'],
      // Without it ioredis went on, ready, in database 0.
      ['no +select, with a database number in REDIS_URL', README_ACL.filter((rule) => rule !== '+select'), "NOPERM this user has no permissions to run the 'select' command", '/2'],
    ] as [string, string[], string, string?][])('at start (%s): the gateway exits 1, naming REDIS_URL, Redis\'s refusal and the README\'s ACL, instead of running on per-process limits', { timeout: 100_000 }, async ([lacking, rules, refusal, databaseNumber], context) => {
      const { env, apiPort } = await gatewayEnv(database.url, await userWith(lacking.replace(/\W+/g, '-'), rules, databaseNumber))
      const gateway = await startOwn(context, 'gateway/src/main.ts', { ...env, GATEWAY_CONFIG: patientConfig })
      expect(await exitWithin(gateway, 30_000)).toEqual({ code: 1, signal: null })
      const output = gateway.output()
      expect(output).toContain(`gateway cannot start: cannot use Redis at REDIS_URL: it refuses the gateway a command or key it needs (${refusal}`)
      expect(output).toContain('give the gateway\'s Redis user what the README\'s "Redis ACL" lists: keys ~rl:* ~anon:*, commands +evalsha +eval +time')
      expect(output).not.toContain('limits follow onStoreFailure')
      expect(output).not.toContain(PASSWORD)
      await expect(fetch(`http://127.0.0.1:${apiPort}/v1/pets`)).rejects.toThrow()
    })

    it.concurrent('with the README\'s ACL it starts, ready with closed, and admits keyed requests decided in Redis; an ACL narrowed while it runs is one error line naming the fix, not one per request', async (context) => {
      const { env, opsPort, apiPort } = await gatewayEnv(database.url, await userWith('gateway', README_ACL))
      const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-redis-acl-'))
      const pool = createPool({ connectionString: database.url, applicationName: 'redis-acl-test' })
      try {
        const configPath = path.join(directory, 'gateway.yaml')
        const file = parse(readFileSync(patientConfig, 'utf8')) as GatewayConfigFile
        file.onStoreFailure = 'closed'
        writeFileSync(configPath, stringify(file))
        const gateway = await startOwn(context, 'gateway/src/main.ts', { ...env, GATEWAY_CONFIG: configPath, LOG_LEVEL: 'info' })
        await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, gateway, 30_000)
        expect(await probe(opsPort, '/readyz')).toMatchObject({ status: 200, body: { dependencies: { redis: 'up' } } })
        const { record, key } = await createKeyRepository(pool).create({ name: 'redis-acl', plan: 'free' })
        const request = () => fetch(`http://127.0.0.1:${apiPort}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
        const admitted = await request()
        expect(admitted.status).toBe(200)
        expect(admitted.headers.get('ratelimit')).toMatch(/"minute";r=\d+/)
        expect(await admin.pttl(limitKey(record.id))).toBeGreaterThan(0)

        await admin.call('ACL', 'SETUSER', 'gateway', '-evalsha')
        for (let i = 0; i < 5; i++) expect((await request()).status).toBe(503)
        const refusals = () => gateway.output().split('\n').filter((line) => line.includes('Redis refuses the gateway a command or key it needs'))
        await eventually(async () => refusals().length > 0, 5_000)
        expect(refusals()).toHaveLength(1)
        expect(refusals()[0]).toContain('"level":50')
        expect(refusals()[0]).toContain("NOPERM this user has no permissions to run the 'evalsha' command")
        expect(JSON.parse(refusals()[0]!).msg).toContain('give the gateway\'s Redis user what the README\'s "Redis ACL" lists')
        expect(gateway.hasExited()).toBe(false)
      } finally {
        await pool.end()
        rmSync(directory, { recursive: true, force: true })
      }
    }, 120_000)

    // Keyed decisions (~rl:*) and key guesses (~anon:*) are refused or served apart: the decisions
    // served meanwhile do not mean Redis permits the guesses, however far apart the guesses come.
    // The minutes between guesses pass on the gateway's monotonic clock (the reporter's), driven.
    it.concurrent('an ACL that loses ~anon:* while the gateway runs: one error line for key guesses minutes apart, no "permits again" while keyed requests alone are served, and one once guesses are', async (context) => {
      const { env, apiPort } = await gatewayEnv(database.url, await userWith('guesses', README_ACL))
      const pool = createPool({ connectionString: database.url, applicationName: 'redis-acl-test' })
      try {
        const gateway = await startOwn(context, 'gateway/src/main.ts', {
          ...env,
          GATEWAY_CONFIG: patientConfig,
          LOG_LEVEL: 'info',
          NODE_OPTIONS: `--import ${pathToFileURL(path.resolve('test/helpers/drivenClock.mjs')).href}`,
          DRIVEN_CLOCK_STEP_MILLIS: String(2 * 60_000),
        })
        await waitForReady(`http://127.0.0.1:${env.GATEWAY_OPS_PORT}/readyz`, gateway, 30_000)
        const { key } = await createKeyRepository(pool).create({ name: 'redis-acl-guesses', plan: 'free' })
        const keyed = async () => expect((await fetch(`http://127.0.0.1:${apiPort}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })).status).toBe(200)
        const guess = async () => expect((await fetch(`http://127.0.0.1:${apiPort}/v1/pets`, { headers: { authorization: `Bearer ${generateApiKey()}` } })).status).toBe(401)
        const lines = (text: string) => gateway.output().split('\n').filter((line) => line.includes(text))
        const refusals = () => lines('Redis refuses the gateway a command or key it needs')
        const permitted = () => lines("Redis permits the gateway's commands and keys again")
        /** Two minutes pass for the gateway (far past the reporter's quiet period), keyed requests served before and after. */
        const twoMinutesOfKeyed = async () => {
          await keyed()
          const moved = lines('driven clock:').length
          gateway.child.kill('SIGUSR2')
          await eventually(async () => lines('driven clock:').length > moved, 5_000)
          await keyed()
          await keyed()
        }
        await keyed()

        await admin.call('ACL', 'SETUSER', 'guesses', 'resetkeys', '~rl:*')
        await guess()
        await eventually(async () => refusals().length > 0, 5_000)
        expect(refusals()[0]).toContain('NOPERM this user has no permissions to access one of the keys')
        await twoMinutesOfKeyed()
        await guess()
        await keyed()
        await sleep(500)
        expect(permitted()).toEqual([])
        expect(refusals()).toHaveLength(1)

        await admin.call('ACL', 'SETUSER', 'guesses', '~anon:*')
        await twoMinutesOfKeyed()
        await guess()
        await eventually(async () => permitted().length > 0, 5_000)
        expect(permitted()).toHaveLength(1)
        expect(refusals()).toHaveLength(1)
      } finally {
        await pool.end()
      }
    }, 120_000)
  })
})
