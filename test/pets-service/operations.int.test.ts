import net from 'node:net'
import { Writable } from 'node:stream'
import pg from 'pg'
import type { InjectOptions } from 'fastify'
import { pino } from 'pino'
import { Registry } from 'prom-client'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { buildOpsServer } from '../../common/src/ops/opsServer.ts'
import { registerPoolMetrics } from '../../common/src/ops/poolMetrics.ts'
import { buildPetsService } from '../../pets-service/src/app.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { createPetRepository } from '../../pets-service/src/repository/petRepository.ts'
import { TEST_INTERNAL_TOKEN, jsonPost, startPetsService, type RunningPetsService } from '../helpers/petsService.ts'
import { captureLog } from '../helpers/logCapture.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { relayTo } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

const auth = { 'x-internal-token': TEST_INTERNAL_TOKEN }

/** A Postgres address where nothing listens (connection refused). */
async function refusedPostgresUrl(): Promise<string> {
  const server = net.createServer().listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return `postgres://postgres@127.0.0.1:${port}/postgres`
}

/** A Postgres address that accepts connections and never answers (a hung server). */
async function hungPostgres(): Promise<{ url: string; close(): void }> {
  const sockets: net.Socket[] = []
  const server = net.createServer((socket) => sockets.push(socket)).listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  const { port } = server.address() as net.AddressInfo
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    close: () => {
      sockets.forEach((socket) => socket.destroy())
      server.close()
    },
  }
}

async function serviceOn(databaseUrl: string, statementTimeoutMillis?: number, poolLogger?: pino.Logger) {
  const pool = createPool({
    connectionString: databaseUrl,
    applicationName: 'test',
    connectionTimeoutMillis: 1_000,
    statementTimeoutMillis,
    logger: poolLogger,
  })
  const registry = new Registry()
  const app = await buildPetsService({
    pets: createPetRepository(pool),
    internalToken: TEST_INTERNAL_TOKEN,
    logger: pino({ level: 'silent' }),
    registry,
  })
  return { app, pool, registry }
}

/** A throwaway database for the suite, with the pets schema in place before its tests. */
function migratedSuiteDatabase() {
  const database = suiteDatabase()
  beforeAll(async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-test' })
    await migrate(pool, PETS_MIGRATIONS).finally(() => pool.end())
  })
  return database
}

/** Sets (or resets) a database-wide default, as an operator or a managed service may; connections opened afterwards take it. */
async function databaseDefault(url: string, setting: string, value: string | undefined) {
  const admin = new pg.Client({ connectionString: url })
  await admin.connect()
  try {
    // This session may have opened read-only (the default being set): the ALTER must still run.
    await admin.query('SET default_transaction_read_only = off')
    const { rows } = await admin.query<{ name: string }>('SELECT current_database() AS name')
    await admin.query(`ALTER DATABASE "${rows[0]!.name}" ${value === undefined ? `RESET ${setting}` : `SET ${setting} = '${value}'`}`)
  } finally {
    await admin.end()
  }
}

describe('pets-service when Postgres is unavailable', () => {
  it.each([
    ['refuses connections', async () => ({ url: await refusedPostgresUrl(), close: () => undefined })],
    ['accepts connections but never answers', hungPostgres],
  ])('answers 503 service_unavailable with Retry-After within the connection timeout when Postgres %s', async (condition, open) => {
    const postgres = await open()
    const { app, pool } = await serviceOn(postgres.url)
    let slowest = 0
    try {
      for (const request of [
        { method: 'GET' as const, url: '/pets' },
        { method: 'GET' as const, url: '/pets/1' },
        { method: 'POST' as const, url: '/pets', payload: { name: 'Rex', categoryId: 1 } },
      ]) {
        const started = Date.now()
        const response = await app.inject({ ...request, headers: auth })
        slowest = Math.max(slowest, Date.now() - started)
        expect(Date.now() - started).toBeLessThan(3_000)
        expect(response.statusCode).toBe(503)
        expect(response.headers['retry-after']).toMatch(/^[3-7]$/)
        expect(response.json()).toEqual({
          code: 'service_unavailable',
          message: expect.not.stringMatching(/ECONNREFUSED|timeout|127\.0\.0\.1/),
          status: 503,
        })
      }
      recordScenario({
        area: 'Postgres',
        scenario: `the pets-service's Postgres ${condition} (pool connection timeout 1 s)`,
        answered: `list, read and create: 503 service_unavailable with Retry-After 3–7, slowest ${slowest} ms (bound asserted 3 s); no connection detail in the message`,
        lost: 'nothing written: the create was refused before any statement ran',
        test: 'test/pets-service/operations.int.test.ts',
      })
    } finally {
      await app.close()
      await pool.end()
      postgres.close()
    }
  })

  // README, Errors: Retry-After drawn from 3 to 7 s on each 503, so the clients refused during
  // the outage do not all come back in the same second.
  it('spreads the Retry-After of its 503s over whole seconds from 3 to 7 while Postgres refuses connections', async () => {
    const { app, pool } = await serviceOn(await refusedPostgresUrl())
    try {
      const retryAfters = new Set<string>()
      for (let i = 0; i < 40; i++) {
        const response = await app.inject({ method: 'GET', url: '/pets', headers: auth })
        expect(response.statusCode).toBe(503)
        const retryAfter = String(response.headers['retry-after'])
        expect(retryAfter).toMatch(/^[3-7]$/)
        retryAfters.add(retryAfter)
      }
      // 40 draws from five values: all equal with a chance of 5 in 5^40.
      expect(retryAfters.size).toBeGreaterThan(1)
    } finally {
      await app.close()
      await pool.end()
    }
  })
})

describe('pets-service when Postgres stops answering in the middle of a connection', () => {
  const database = migratedSuiteDatabase()

  it('answers 503 within the statement timeout plus one second, then serves again once Postgres answers', async () => {
    const { relay, url: throughRelay } = await relayTo(database.url)
    const statementTimeout = 1_000
    const { app, pool } = await serviceOn(throughRelay, statementTimeout)
    const slowest: Record<string, number> = {}
    try {
      // Warm connections sit idle in the pool: the requests below reuse them, so no connection
      // timeout applies, only the bound on the statement itself.
      const warm = await Promise.all([0, 1, 2].map(() => app.inject({ method: 'GET', url: '/pets', headers: auth })))
      expect(warm.map((response) => response.statusCode)).toEqual([200, 200, 200])
      await relay.silence()
      const requests: Record<string, InjectOptions & { headers?: Record<string, string> }> = {
        list: { method: 'GET', url: '/pets' },
        create: { method: 'POST', url: '/pets', payload: { name: 'Rex', categoryId: 1 } },
        'create with Idempotency-Key': {
          method: 'POST',
          url: '/pets',
          payload: { name: 'Rex', categoryId: 1 },
          headers: { 'idempotency-key': 'hung-postgres-1' },
        },
      }
      await Promise.all(
        Object.entries(requests).map(async ([name, request]) => {
          const started = performance.now()
          const response = await app.inject({ ...request, headers: { ...auth, ...request.headers } })
          slowest[name] = Math.round(performance.now() - started)
          expect(response.statusCode).toBe(503)
          expect(response.headers['retry-after']).toMatch(/^[3-7]$/)
          expect(response.json()).toMatchObject({ code: 'service_unavailable', status: 503 })
        }),
      )
      for (const elapsed of Object.values(slowest)) expect(elapsed).toBeLessThan(statementTimeout + 1_000 + 500)
      await relay.restore()
      const again = await app.inject({ method: 'GET', url: '/pets', headers: auth })
      expect(again.statusCode).toBe(200)
      expect(again.json()).toEqual([])
      recordScenario({
        area: 'Postgres',
        scenario: `the pets-service's Postgres stops answering on open connections (statement timeout ${statementTimeout} ms)`,
        answered: `list, create and idempotent create: 503 service_unavailable with Retry-After 3–7 in ${Object.values(slowest).join(', ')} ms (bound asserted ${statementTimeout + 1_500} ms); 200 again as soon as Postgres answered`,
        lost: 'nothing: no pet stored, the table is empty afterwards',
        test: 'test/pets-service/operations.int.test.ts',
      })
    } finally {
      await app.close()
      await pool.end()
      await relay.close()
    }
  })
})

describe('pets-service after a failover that leaves its open connections mute (the same address, another host)', () => {
  const database = migratedSuiteDatabase()

  // Each idle connection went mute the same way; found one request at a time, each cost a
  // request the whole statement bound and a 503, and a log line each once closed.
  it('answers only the first request 503 after the statement bound, the next ones 200 at once on new connections, and logs it once', async () => {
    const { relay, url: throughRelay } = await relayTo(database.url)
    const log = captureLog()
    const { app, pool } = await serviceOn(throughRelay, 1_000, pino(log.stream))
    try {
      await Promise.all([0, 1, 2, 3].map(() => pool.query('SELECT pg_sleep(0.05)')))
      expect(pool.idleCount).toBe(4)
      // Open connections carry nothing any more; new ones reach Postgres (now at the other host).
      await relay.silence()
      await relay.restore()
      const answers: { status: number; millis: number }[] = []
      for (let request = 0; request < 4; request++) {
        const started = performance.now()
        const response = await app.inject({ method: 'GET', url: '/pets', headers: auth })
        answers.push({ status: response.statusCode, millis: Math.round(performance.now() - started) })
      }
      expect(answers.map((answer) => answer.status)).toEqual([503, 200, 200, 200])
      const lines = log.entries().filter((entry) => entry.level === 40)
      expect(lines).toHaveLength(1)
      expect(lines[0]).toMatchObject({ msg: expect.stringContaining('Postgres gave no answer on a connection'), unansweredClosed: 1, idleClosed: 3 })
      recordScenario({
        area: 'Postgres',
        scenario: "the pets-service's Postgres fails over behind the same address: its 4 idle connections go mute, new ones are answered (statement timeout 1000 ms)",
        answered: `4 requests one after another: ${answers.map((answer) => `${answer.status} in ${answer.millis} ms`).join(', ')}; one warning logged for the 4 connections closed`,
        lost: 'nothing: only the request on the first mute connection failed',
        test: 'test/pets-service/operations.int.test.ts',
      })
    } finally {
      await app.close()
      await relay.close()
      await pool.end()
    }
  })

  // The sweep runs on a timer and closes the idle connections' sockets; pg-pool let them go only
  // once the sockets' close was reported, later in that turn of the event loop. A request arriving
  // meanwhile was handed one of them and answered 503 at once, instead of connecting afresh.
  it('serves a request arriving just as the idle connections are closed on a new connection', async () => {
    const { relay, url: throughRelay } = await relayTo(database.url)
    let arriving: Promise<number> | undefined
    const started: { service?: Awaited<ReturnType<typeof serviceOn>> } = {}
    const atTheWarning = new Writable({
      write(chunk: Buffer, _encoding, done) {
        if (chunk.toString().includes('Postgres gave no answer on a connection')) {
          arriving ??= started.service!.app.inject({ method: 'GET', url: '/pets', headers: auth }).then((response) => response.statusCode)
        }
        done()
      },
    })
    started.service = await serviceOn(throughRelay, 1_000, pino(atTheWarning))
    const { app, pool } = started.service
    try {
      await Promise.all([0, 1, 2, 3].map(() => pool.query('SELECT pg_sleep(0.05)')))
      expect(pool.idleCount).toBe(4)
      await relay.silence()
      await relay.restore()
      expect((await app.inject({ method: 'GET', url: '/pets', headers: auth })).statusCode).toBe(503)
      expect(arriving).toBeDefined()
      expect(await arriving).toBe(200)
      // The four mute connections are out of the pool; only the new one is counted.
      expect(pool.totalCount).toBe(1)
    } finally {
      await app.close()
      await relay.close()
      await pool.end()
    }
  })
})

describe('pets-service when its Postgres takes no writes for a while (failover, default_transaction_read_only)', () => {
  const database = migratedSuiteDatabase()

  const defaultReadOnly = (on: boolean) => databaseDefault(database.url, 'default_transaction_read_only', on ? 'on' : undefined)

  it('answers a create 503 with Retry-After, not 500, and stores it once Postgres takes writes again', async () => {
    await defaultReadOnly(true)
    // Started after the change: every connection it opens is read-only.
    const { app, pool } = await serviceOn(database.url)
    try {
      const list = await app.inject({ method: 'GET', url: '/pets', headers: auth })
      expect(list.statusCode).toBe(200)
      const creates: Record<string, Record<string, string>> = { create: {}, 'create with Idempotency-Key': { 'idempotency-key': 'read-only-1' } }
      for (const headers of Object.values(creates)) {
        const response = await app.inject({ method: 'POST', url: '/pets', payload: { name: 'Rex', categoryId: 1 }, headers: { ...auth, ...headers } })
        expect(response.statusCode, response.body).toBe(503)
        expect(response.headers['retry-after']).toMatch(/^[3-7]$/)
        expect(response.json()).toMatchObject({ code: 'service_unavailable', status: 503 })
      }
      await defaultReadOnly(false)
      // A connection opened while the database was read-only stays so for its whole session: the
      // one each failed create ran on must be gone, not back in the pool for the retry.
      const retried = await app.inject({ method: 'POST', url: '/pets', payload: { name: 'Rex', categoryId: 1 }, headers: { ...auth, 'idempotency-key': 'read-only-1' } })
      expect(retried.statusCode, retried.body).toBe(201)
      const { rows } = await pool.query<{ count: number }>('SELECT count(*)::int AS count FROM pets.pets')
      expect(rows[0]!.count).toBe(1)
    } finally {
      await defaultReadOnly(false)
      await app.close()
      await pool.end()
    }
  })
})

// Retries racing on one Idempotency-Key rely on READ COMMITTED (a blocked claim sees the row the
// first committed): with the database's default set stricter, some got 500 (SQLSTATE 40001).
describe('pets-service on a database whose default isolation is stricter than READ COMMITTED', () => {
  const database = migratedSuiteDatabase()

  it.each(['repeatable read', 'serializable'])('%s: retries racing on one Idempotency-Key get the first pet or 422, never 500', async (isolation) => {
    await databaseDefault(database.url, 'default_transaction_isolation', isolation)
    const { app, pool } = await serviceOn(database.url)
    try {
      const create = (key: string, name: string) =>
        app.inject({ method: 'POST', url: '/pets', payload: { name, categoryId: 1 }, headers: { ...auth, 'idempotency-key': key } })
      const tag = isolation.replace(' ', '-')
      const same = await Promise.all(Array.from({ length: 20 }, () => create(`same-${tag}`, 'Rex')))
      expect(same.map((response) => response.statusCode)).toEqual(Array(20).fill(201))
      expect(new Set(same.map((response) => (response.json() as { id: number }).id)).size).toBe(1)
      const different = await Promise.all(Array.from({ length: 10 }, (_, index) => create(`different-${tag}`, `Rex ${index}`)))
      expect(different.map((response) => response.statusCode).sort()).toEqual([201, ...Array(9).fill(422)])
      const { rows } = await pool.query<{ count: number }>("SELECT count(*)::int AS count FROM pets.pets WHERE name LIKE 'Rex%'")
      expect(rows[0]!.count).toBe(2)
      await pool.query('DELETE FROM pets.pets')
    } finally {
      await databaseDefault(database.url, 'default_transaction_isolation', undefined)
      await app.close()
      await pool.end()
    }
  })
})

// A lock_timeout set for the database or the role ends a statement waiting on a lock (an
// operator's or a migration's) with 55P03: the same wait that gets 503 without it got 500.
describe('pets-service on a database with a lock_timeout, while a table lock is held', () => {
  const database = migratedSuiteDatabase()

  it('answers list and create 503 with Retry-After, not 500', async () => {
    await databaseDefault(database.url, 'lock_timeout', '200ms')
    const { app, pool } = await serviceOn(database.url)
    const holder = new pg.Client({ connectionString: database.url })
    await holder.connect()
    try {
      await holder.query('BEGIN')
      await holder.query('LOCK TABLE pets.pets IN ACCESS EXCLUSIVE MODE')
      for (const request of [
        { method: 'GET' as const, url: '/pets' },
        { method: 'POST' as const, url: '/pets', payload: { name: 'Rex', categoryId: 1 } },
        { method: 'POST' as const, url: '/pets', payload: { name: 'Rex', categoryId: 1 }, headers: { 'idempotency-key': 'locked-1' } },
      ]) {
        const response = await app.inject({ ...request, headers: { ...auth, ...request.headers } })
        expect(response.statusCode, `${request.method} ${response.body}`).toBe(503)
        expect(response.headers['retry-after']).toMatch(/^[3-7]$/)
      }
    } finally {
      await holder.query('ROLLBACK').catch(() => undefined)
      await holder.end()
      await databaseDefault(database.url, 'lock_timeout', undefined)
      await app.close()
      await pool.end()
    }
  })
})

describe('pets-service when a column it reads changes type while it runs (a migration of another version)', () => {
  const database = migratedSuiteDatabase()

  it('goes on answering list and read 200, not 500 once per connection', async () => {
    const { app, pool } = await serviceOn(database.url)
    try {
      const created = await app.inject({ method: 'POST', url: '/pets', payload: { name: 'Rex', categoryId: 1 }, headers: auth })
      const id = (created.json() as { id: number }).id
      // Prepared on the pool's connections, with the column's type of then.
      for (const url of ['/pets', `/pets/${id}`]) expect((await app.inject({ method: 'GET', url, headers: auth })).statusCode).toBe(200)
      await pool.query('ALTER TABLE pets.pets ALTER COLUMN name TYPE varchar(300)')
      for (const url of ['/pets', `/pets/${id}`]) {
        const response = await app.inject({ method: 'GET', url, headers: auth })
        expect(response.statusCode, response.body).toBe(200)
        expect(response.body).toContain('"name":"Rex"')
      }
    } finally {
      await app.close()
      await pool.end()
    }
  })
})

describe('pets-service operations', () => {
  const database = suiteDatabase()

  it('applies each migration exactly once when two instances start together', async () => {
    const pools = [0, 1].map(() => createPool({ connectionString: database.url, applicationName: 'migrate-test' }))
    try {
      const applied = await Promise.all(pools.map((pool) => migrate(pool, PETS_MIGRATIONS)))
      expect(applied.flat().sort()).toEqual([1, 2, 3])
      const { rows } = await pools[0]!.query('SELECT version FROM pets.schema_migrations ORDER BY version')
      expect(rows).toEqual([{ version: 1 }, { version: 2 }, { version: 3 }])
      expect(await migrate(pools[0]!, PETS_MIGRATIONS)).toEqual([])
    } finally {
      await Promise.all(pools.map((pool) => pool.end()))
    }
  })

  it('serves liveness, readiness with each dependency state, and Prometheus metrics', async () => {
    const { app, pool, registry } = await serviceOn(database.url)
    registerPoolMetrics(registry, pool)
    let accepting = true
    const ops = buildOpsServer({
      registry,
      logger: pino({ level: 'silent' }),
      isAccepting: () => accepting,
      dependencies: { postgres: async () => void (await pool.query('SELECT 1')) },
    })
    try {
      expect((await ops.inject('/healthz')).statusCode).toBe(200)
      const ready = await ops.inject('/readyz')
      expect(ready.statusCode).toBe(200)
      expect(ready.json()).toEqual({ status: 'ready', dependencies: { postgres: 'up' } })

      await app.inject({ method: 'GET', url: '/pets', headers: auth })
      const metrics = await ops.inject('/metrics')
      expect(metrics.headers['content-type']).toMatch(/^text\/plain/)
      expect(metrics.body).toMatch(/http_requests_total\{method="GET",route="\/pets",status_class="2xx"\} 1/)
      expect(metrics.body).toMatch(/http_request_duration_seconds_bucket\{le="0.1",method="GET",route="\/pets",status_class="2xx"\}/)
      expect(metrics.body).toMatch(/pg_pool_connections\{state="idle"\} \d+/)
      const elsewhere = await ops.inject('/metrics/nope?x=1')
      expect(elsewhere.statusCode).toBe(404)
      expect(elsewhere.json()).toEqual({ code: 'not_found', message: expect.stringContaining('/healthz, /readyz and /metrics'), status: 404 })

      accepting = false
      const draining = await ops.inject('/readyz')
      expect(draining.statusCode).toBe(503)
      expect(draining.json()).toMatchObject({ status: 'shutting_down' })
    } finally {
      await ops.close()
      await app.close()
      await pool.end()
    }
  })

  it('reports not ready, naming Postgres, while Postgres is unreachable', async () => {
    const pool = createPool({ connectionString: await refusedPostgresUrl(), applicationName: 'test' })
    const ops = buildOpsServer({
      registry: new Registry(),
      logger: pino({ level: 'silent' }),
      isAccepting: () => true,
      dependencies: { postgres: async () => void (await pool.query('SELECT 1')) },
    })
    const ready = await ops.inject('/readyz')
    expect(ready.statusCode).toBe(503)
    expect(ready.json()).toEqual({ status: 'not_ready', dependencies: { postgres: 'down' } })
    await ops.close()
    await pool.end()
  })

  describe('logs', () => {
    let service: RunningPetsService
    const log = captureLog()

    beforeAll(async () => {
      service = await startPetsService(database.url, { logStream: log.stream })
    })
    afterAll(async () => {
      await service?.close()
    })

    it('writes one JSON line per request with its request id, route, status and duration', async () => {
      await service.request('/pets/77', { headers: { 'x-request-id': 'log-test-1' } })
      await service.request('/pets', jsonPost({ name: 'Rex', categoryId: 1 }, { 'x-request-id': 'log-test-2' }))
      const lines = log.entries()
      const first = lines.filter((line) => line.requestId === 'log-test-1')
      expect(first).toEqual([
        expect.objectContaining({ method: 'GET', route: '/pets/:petId', status: 404, durationMs: expect.any(Number) }),
      ])
      expect(lines.filter((line) => line.requestId === 'log-test-2')).toEqual([
        expect.objectContaining({ method: 'POST', route: '/pets', status: 201 }),
      ])
    })

    it('never writes the internal credential', async () => {
      await fetch(`${service.url}/pets`, { headers: { 'x-internal-token': 'wrong-token-in-a-log?' } })
      const text = log.lines.join('\n')
      expect(text).not.toContain(TEST_INTERNAL_TOKEN)
      expect(text).not.toContain('wrong-token-in-a-log?')
      expect(log.entries().some((line) => line.status === 401)).toBe(true)
    })
  })

  it('finishes a request in flight when it closes, then lets go of the connection', async () => {
    const { app, pool } = await serviceOn(database.url)
    await migrate(pool, PETS_MIGRATIONS)
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as net.AddressInfo
    const client = await pool.connect()
    try {
      // Hold a lock so one request is in flight when the drain starts.
      await client.query('BEGIN')
      await client.query('LOCK TABLE pets.pets IN ACCESS EXCLUSIVE MODE')
      const inFlight = fetch(`http://127.0.0.1:${port}/pets`, { headers: auth })
      await new Promise((resolve) => setTimeout(resolve, 200))
      const closing = app.close()
      await new Promise((resolve) => setTimeout(resolve, 200))
      await client.query('COMMIT')
      const response = await inFlight
      expect(response.status).toBe(200)
      expect(response.headers.get('connection')).toBe('close')
      await closing
      await expect(fetch(`http://127.0.0.1:${port}/pets`, { headers: auth })).rejects.toThrow()
    } finally {
      client.release()
      await pool.end()
    }
  })

  it('answers a request that still reaches it while closing with a 503 Error body', async () => {
    const { app, pool } = await serviceOn(database.url)
    await migrate(pool, PETS_MIGRATIONS)
    // Holds the close in its first phase, when listeners are still open, for long enough to
    // send a request on a connection the client kept alive.
    let release: () => void = () => undefined
    app.addHook('preClose', () => new Promise<void>((resolve) => (release = resolve)))
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as net.AddressInfo
    try {
      expect((await fetch(`http://127.0.0.1:${port}/pets`, { headers: auth })).status).toBe(200)
      const closing = app.close()
      await new Promise((resolve) => setTimeout(resolve, 50))
      const late = await fetch(`http://127.0.0.1:${port}/pets`, { headers: auth })
      expect(late.status).toBe(503)
      expect(late.headers.get('retry-after')).toBe('1')
      expect(late.headers.get('connection')).toBe('close')
      expect(await late.json()).toEqual({ code: 'service_unavailable', message: expect.any(String), status: 503 })
      release()
      await closing
    } finally {
      release()
      await pool.end()
    }
  })

  // Regression: one DELETE of the whole backlog ran past the statement timeout, was rolled back,
  // and every later purge had more to delete: the table grew without bound.
  it('purges a backlog of expired idempotency keys that no single statement could delete within the timeout, halving a batch the timeout cancels', async () => {
    const setup = createPool({ connectionString: database.url, applicationName: 'purge-setup', max: 1, statementTimeoutMillis: 120_000 })
    // 100 ms: too short for one DELETE of the whole backlog, as the first batch asked for here is;
    // the batches that fit are found by halving, however busy the machine.
    const pool = createPool({ connectionString: database.url, applicationName: 'purge-test', max: 1, statementTimeoutMillis: 100 })
    try {
      await migrate(setup, PETS_MIGRATIONS)
      await setup.query(
        `INSERT INTO pets.idempotency_keys (consumer, key, fingerprint, created_at)
         SELECT 'bulk', 'key-' || g, 'fp', now() - interval '25 hours' FROM generate_series(1, 400000) g`,
      )
      await setup.query(`INSERT INTO pets.idempotency_keys (consumer, key, fingerprint) VALUES ('bulk', 'recent', 'fp')`)
      expect(await createPetRepository(pool).purgeIdempotencyKeys(400_000)).toBe(400_000)
      const { rows } = await setup.query<{ key: string }>(`SELECT key FROM pets.idempotency_keys WHERE consumer = 'bulk'`)
      expect(rows).toEqual([{ key: 'recent' }])
    } finally {
      await Promise.all([setup.end(), pool.end()])
    }
  })

  it('refuses a create with 400 before touching Postgres when the body is invalid', async () => {
    // With no Postgres at all, a 400 (not 503) shows that validation ran without a connection.
    const { app, pool } = await serviceOn(await refusedPostgresUrl())
    try {
      const response = await app.inject({
        method: 'POST',
        url: '/pets',
        headers: { 'content-type': 'application/json', 'x-internal-token': TEST_INTERNAL_TOKEN },
        payload: JSON.stringify({ name: '' }),
      })
      expect(response.statusCode).toBe(400)
      expect(response.json()).toMatchObject({ code: 'validation_failed', status: 400 })
      expect(pool.totalCount, 'connections opened').toBe(0)
    } finally {
      await app.close()
      await pool.end()
    }
  })
})
