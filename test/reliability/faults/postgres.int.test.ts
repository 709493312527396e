import { mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import pino from 'pino'
import { Registry } from 'prom-client'
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest'
import { createPool } from '../../../common/src/database/pool.ts'
import { postgresAnswers } from '../../../common/src/database/privileges.ts'
import { waitForPostgres } from '../../../common/src/database/waitForPostgres.ts'
import { buildPetsService } from '../../../pets-service/src/app.ts'
import { createPetRepository } from '../../../pets-service/src/repository/petRepository.ts'
import { expectErrorResponse } from '../../helpers/assertions.ts'
import { captureLog } from '../../helpers/logCapture.ts'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { TEST_INTERNAL_TOKEN, startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { recordScenario } from '../../helpers/scenarioLog.ts'
import { cuttableRelay, relayTo } from '../../helpers/tcpRelay.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'

/**
 * The README's fault table: "Postgres unreachable: 503 service_unavailable within the 2 s
 * connection timeout". This is that bound plus slack for a loaded machine; a hang would be the
 * 5 s statement timeout or more.
 */
const ANSWER_WITHIN_MILLIS = 4_000
/**
 * A statement on a connection whose server stopped answering: the shipped 5 s statement timeout
 * plus the pool's 0.5 s grace and two 250 ms sweeps (common/src/database/pool.ts) is 6 s, plus
 * slack for a loaded machine.
 */
const SILENT_POSTGRES_BOUND_MILLIS = 7_500
/** The gateway's key-cache TTL in this test (config keyCache.ttlSeconds; 60 s shipped). */
const KEY_CACHE_TTL_SECONDS = 5
const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

type Relay = Awaited<ReturnType<typeof cuttableRelay>>

interface Pet {
  id: number
  name: string
  categoryId: number
  status: string
}

/**
 * Postgres goes away for both services without stopping the shared server: each service reaches
 * it through its own TCP relay, and cutting the relays destroys every connection and refuses new
 * ones, as a lost network or a stopped server would.
 */
describe('Postgres down (the services reach it through relays the test cuts)', () => {
  const database = suiteDatabase()
  let gatewayRelay: Relay
  let petsRelay: Relay
  let pets: RunningPetsService
  let gateway: RunningGateway
  let direct: pg.Pool
  const petsLog = captureLog()
  const gatewayLog = captureLog()
  /**
   * The error lines for requests Postgres being away failed: one per service at the first, then at
   * most one a minute with a count. Before, each had a line with a stack of its own.
   */
  const outageLines = (log: ReturnType<typeof captureLog>) => ({
    perRequest: log.entries().filter((entry) => entry.msg === 'request failed').length,
    outage: log.entries().filter((entry) => entry.level === 50 && String(entry.msg).startsWith('Postgres unavailable to the')).map((entry) => entry.requests),
    causes: log
      .entries()
      .filter((entry) => entry.level === 50 && String(entry.msg).startsWith('Postgres unavailable to the'))
      .map((entry) => String((entry.err as { message?: string }).message).replace(/\d+/g, '#')),
  })

  const through = (relay: Relay) => {
    const url = new URL(database.url)
    url.host = `127.0.0.1:${relay.port}`
    return url.toString()
  }

  beforeAll(async () => {
    const target = new URL(database.url)
    gatewayRelay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    petsRelay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    pets = await startPetsService(through(petsRelay), { logStream: petsLog.stream })
    gateway = await startGateway({
      databaseUrl: through(gatewayRelay),
      petsUrl: pets.url,
      logStream: gatewayLog.stream,
      configure: (file) => {
        file.keyCache.ttlSeconds = KEY_CACHE_TTL_SECONDS
      },
    })
    direct = new pg.Pool({ connectionString: database.url, max: 2 })
  })
  afterAll(async () => {
    await gatewayRelay?.restore().catch(() => undefined)
    await petsRelay?.restore().catch(() => undefined)
    await gateway?.close()
    await pets?.close()
    await gatewayRelay?.close()
    await petsRelay?.close()
    await direct?.end()
  })

  async function timed(path: string, init: RequestInit & { key: string }) {
    const started = performance.now()
    const response = await gateway.request(path, init)
    return { response, millis: performance.now() - started }
  }

  const create = (key: string, name: string, idempotencyKey: string) =>
    timed('/v1/pets', {
      key,
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
      body: JSON.stringify({ name, categoryId: 3 }),
    })

  /**
   * Puts `key` in the gateway's key cache; returns the span within which it was looked up (its TTL
   * runs from a moment inside it). A new key's creation reaches the gateway as a key change, which
   * evicts it from the cache, so the lookup that counts is one made after that change: the change
   * feed reads the log every second, and a lookup is repeated until the next request is a cache hit.
   */
  async function warmKeyCache(key: string): Promise<{ from: number; until: number }> {
    await sleep(1_500)
    let lookup = { from: 0, until: 0 }
    for (let attempt = 0; attempt < 10; attempt++) {
      const misses = gateway.cache.stats.misses
      const from = performance.now()
      const response = await gateway.request('/v1/pets?limit=1', { key })
      expect(response.status).toBe(200)
      await response.arrayBuffer()
      if (gateway.cache.stats.misses === misses) return lookup
      lookup = { from, until: performance.now() }
    }
    throw new Error('the key never stayed in the gateway cache')
  }

  /** Polls until `check` holds; returns how long that took. */
  async function within(millis: number, check: () => Promise<boolean>): Promise<number> {
    const started = performance.now()
    while (!(await check().catch(() => false))) {
      if (performance.now() - started > millis) throw new Error(`not within ${millis} ms`)
      await sleep(100)
    }
    return performance.now() - started
  }

  it('keys in the gateway cache keep working for their TTL, other keys get 503 service_unavailable, and both work again when Postgres returns', async () => {
    const cached = await gateway.createKey({ name: 'cached' })
    const uncached = await gateway.createKey({ name: 'uncached' })
    const cachedAt = await warmKeyCache(cached.key)

    await gatewayRelay.cut()
    try {
      // The cached key is still authenticated, rate limited and proxied: the catalogue answers.
      const list = await timed('/v1/pets', { key: cached.key })
      expect(list.response.status).toBe(200)
      await list.response.arrayBuffer()
      const created = await create(cached.key, 'Cached while down', 'cached-while-down')
      expect(created.response.status).toBe(201)
      await created.response.arrayBuffer()
      expect(performance.now() - cachedAt.from, 'still inside the cache TTL').toBeLessThan(KEY_CACHE_TTL_SECONDS * 1_000)

      // A key the gateway has not seen cannot be checked: 503, never 401 and never a hang.
      const unknown = await timed('/v1/pets', { key: uncached.key })
      expect(unknown.millis).toBeLessThan(ANSWER_WITHIN_MILLIS)
      expect(unknown.response.headers.get('retry-after')).toMatch(/^[3-7]$/)
      await expectErrorResponse(unknown.response, 503, 'service_unavailable')

      // Past its TTL the cached key is one the gateway cannot check either.
      await sleep(Math.max(cachedAt.until + KEY_CACHE_TTL_SECONDS * 1_000 + 100 - performance.now(), 0))
      const expired = await timed('/v1/pets', { key: cached.key })
      expect(expired.millis).toBeLessThan(ANSWER_WITHIN_MILLIS)
      await expectErrorResponse(expired.response, 503, 'service_unavailable')
      expect(outageLines(gatewayLog)).toMatchObject({ perRequest: 0, outage: [1] })

      await gatewayRelay.restore()
      const recoveredIn = await within(10_000, async () => {
        const [a, b] = await Promise.all([gateway.request('/v1/pets', { key: cached.key }), gateway.request('/v1/pets', { key: uncached.key })])
        await Promise.all([a.arrayBuffer(), b.arrayBuffer()])
        return a.status === 200 && b.status === 200
      })
      // The change feed is back too: a revocation made now is refused within the README's 2 s.
      await gateway.keys.revoke(uncached.id)
      const revokedIn = await within(2_000, async () => {
        const response = await gateway.request('/v1/pets', { key: uncached.key })
        await response.arrayBuffer()
        return response.status === 401
      })

      recordScenario({
        area: 'Postgres',
        scenario: `the gateway's Postgres unreachable (relay cut), key cache TTL ${KEY_CACHE_TTL_SECONDS} s`,
        answered:
          `a cached key: 200 list and 201 create while within its TTL, then 503 service_unavailable in ${Math.round(expired.millis)} ms; ` +
          `a key not in the cache: 503 service_unavailable, Retry-After 3–7, in ${Math.round(unknown.millis)} ms; both 200 again ` +
          `${Math.round(recoveredIn)} ms after Postgres returned, and a revocation refused ${Math.round(revokedIn)} ms after it was made`,
        lost: 'nothing: the create made while down is stored (201), no key refused as invalid while Postgres was away',
        test: 'test/reliability/faults/postgres.int.test.ts',
      })
    } finally {
      await gatewayRelay.restore().catch(() => undefined)
    }
  })

  it('creates in flight or sent while Postgres is down answer 201 or 503, write nothing half-way, and retried with their Idempotency-Key make each pet exactly once', async () => {
    const { key } = await gateway.createKey({ name: 'creator', plan: 'pro' })
    await warmKeyCache(key)
    const { rows: before } = await direct.query<{ count: number }>('SELECT count(*)::int AS count FROM pets.pets')

    // 24 creates start; Postgres goes away under them once the first has been answered.
    const names = Array.from({ length: 24 }, (_, i) => `In flight ${i}`)
    let firstAnswered: () => void = () => undefined
    const firstAnswer = new Promise<void>((resolve) => (firstAnswered = resolve))
    const inFlight = names.map((name, i) =>
      create(key, name, `flight-${i}`).then(async ({ response, millis }) => {
        firstAnswered()
        return { name, idempotencyKey: `flight-${i}`, status: response.status, millis, body: (await response.json()) as Pet & { code?: string } }
      }),
    )
    await firstAnswer
    await Promise.all([petsRelay.cut(), gatewayRelay.cut()])
    const flown = await Promise.all(inFlight)

    // Sent while it is down: every one 503, quickly.
    const whileDown = []
    for (let i = 0; i < 4; i++) {
      const { response, millis } = await create(key, `While down ${i}`, `down-${i}`)
      expect(millis).toBeLessThan(ANSWER_WITHIN_MILLIS)
      expect(response.headers.get('retry-after')).toMatch(/^[3-7]$/)
      await expectErrorResponse(response, 503, 'service_unavailable')
      whileDown.push({ name: `While down ${i}`, idempotencyKey: `down-${i}`, millis })
    }
    // One line at once per cause (statements cut off in flight, then connections refused), none per request.
    const said = outageLines(petsLog)
    expect(said.perRequest).toBe(0)
    expect(said.outage.length).toBeGreaterThanOrEqual(1)
    expect(said.outage.every((requests) => requests === 1)).toBe(true)
    expect(new Set(said.causes).size).toBe(said.causes.length)
    for (const answer of flown) {
      expect([201, 503], `${answer.name}: ${JSON.stringify(answer.body)}`).toContain(answer.status)
      if (answer.status === 503) expect(answer.body.code).toBe('service_unavailable')
      expect(answer.millis).toBeLessThan(ANSWER_WITHIN_MILLIS + 5_000)
    }

    await Promise.all([petsRelay.restore(), gatewayRelay.restore()])
    // Nothing half-way: no idempotency claim without its pet, no pet beyond the creates.
    const { rows: orphans } = await direct.query('SELECT key FROM pets.idempotency_keys WHERE pet_id IS NULL')
    expect(orphans).toEqual([])

    // The client retries what got 503, with the same Idempotency-Key: 201, and never a second pet.
    const retried = [...flown.filter((answer) => answer.status === 503), ...whileDown]
    const recoveredIn = await within(10_000, async () => {
      const response = await gateway.request('/v1/pets?limit=1', { key })
      await response.arrayBuffer()
      return response.status === 200
    })
    const final = new Map<string, Pet>()
    for (const answer of flown.filter((answer) => answer.status === 201)) final.set(answer.idempotencyKey, answer.body)
    for (const attempt of retried) {
      const { response } = await create(key, attempt.name, attempt.idempotencyKey)
      expect(response.status, attempt.name).toBe(201)
      final.set(attempt.idempotencyKey, (await response.json()) as Pet)
    }
    for (const answer of flown.filter((answer) => answer.status === 201)) {
      const { response } = await create(key, answer.name, answer.idempotencyKey)
      expect(response.headers.get('idempotent-replayed')).toBe('true')
      expect(await response.json()).toEqual(answer.body)
    }

    const total = names.length + whileDown.length
    const { rows: after } = await direct.query<{ count: number }>('SELECT count(*)::int AS count FROM pets.pets')
    expect(after[0]!.count - before[0]!.count, 'one pet per create').toBe(total)
    const { rows: stored } = await direct.query<{ id: number; name: string }>(
      'SELECT id::int AS id, name FROM pets.pets WHERE id = ANY($1::bigint[])',
      [[...final.values()].map((pet) => pet.id)],
    )
    expect(new Map(stored.map((row) => [row.id, row.name]))).toEqual(new Map([...final.values()].map((pet) => [pet.id, pet.name])))

    const flown503 = flown.filter((answer) => answer.status === 503)
    recordScenario({
      area: 'Postgres',
      scenario: `Postgres unreachable for both services (relays cut) under ${names.length} concurrent creates, then ${whileDown.length} more while down`,
      answered:
        `in flight: ${flown.length - flown503.length} × 201, ${flown503.length} × 503 service_unavailable (slowest ${Math.round(Math.max(...flown.map((answer) => answer.millis)))} ms); ` +
        `while down: ${whileDown.length} × 503 with Retry-After 3–7, slowest ${Math.round(Math.max(...whileDown.map((answer) => answer.millis)))} ms; ` +
        `200 again ${Math.round(recoveredIn)} ms after Postgres returned`,
      lost: `nothing: no idempotency claim without its pet; ${retried.length} retries with the same Idempotency-Key answered 201, and the table grew by exactly ${total} pets for ${total} creates`,
      test: 'test/reliability/faults/postgres.int.test.ts',
    })
  })
})

/**
 * The other way Postgres fails: the connections stay open and nothing comes back (a frozen server
 * or host, a network that drops packets silently). A key lookup must not wait for TCP to give up.
 */
describe('the gateway\'s Postgres stops answering on open connections', () => {
  const database = suiteDatabase()

  it('a key not in the cache gets 503 service_unavailable within the statement bound, a cached key keeps working, and the key is served again once Postgres answers', async () => {
    const { relay, url: throughRelay } = await relayTo(database.url)
    const pets = await startPetsService(database.url)
    const gateway = await startGateway({ databaseUrl: throughRelay, petsUrl: pets.url })
    try {
      const cached = await gateway.createKey({ name: 'cached' })
      const uncached = await gateway.createKey({ name: 'uncached' })
      await gateway.announced(cached.key, uncached.key)
      const warm = await gateway.request('/v1/pets', { key: cached.key })
      expect(warm.status).toBe(200)
      await warm.arrayBuffer()
      // A gateway that has served concurrent lookups keeps several connections idle (up to its pool
      // size): more than the lookup below, the change feed and the unban job take while Postgres is
      // silent, so some are still in the pool when it answers again.
      await Promise.all(Array.from({ length: 5 }, () => gateway.pool.query('SELECT pg_sleep(0.05)')))

      await relay.silence()
      const started = performance.now()
      const [unknown, known] = await Promise.all([
        gateway.request('/v1/pets', { key: uncached.key }).then((response) => ({ response, millis: performance.now() - started })),
        gateway.request('/v1/pets', { key: cached.key }),
      ])
      expect(known.status).toBe(200)
      await known.arrayBuffer()
      // Postgres's own statement timeout cannot fire on a server that does not answer; the
      // pool's client-side bound ends the wait.
      expect(unknown.millis).toBeGreaterThan(4_000)
      expect(unknown.millis).toBeLessThan(SILENT_POSTGRES_BOUND_MILLIS)
      expect(Number(unknown.response.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      await expectErrorResponse(unknown.response, 503, 'service_unavailable')

      await relay.restore()
      // The connections that went mute stay mute (the relay, like a host that is gone, never answers
      // on them): a lookup that takes one is answered 503 again within the bound, and the sweep drops
      // it. Once they are gone, the key is served.
      const recovered = performance.now()
      await vi.waitFor(
        async () => {
          const again = await gateway.request('/v1/pets', { key: uncached.key })
          await again.arrayBuffer()
          expect(again.status).toBe(200)
        },
        { timeout: 3 * SILENT_POSTGRES_BOUND_MILLIS, interval: 50 },
      )
      const servedAgainMillis = performance.now() - recovered
      recordScenario({
        area: 'Postgres',
        scenario: "the gateway's Postgres stops answering on open connections (shipped 5 s statement timeout)",
        answered: `a key not in the cache: 503 service_unavailable with Retry-After in ${Math.round(unknown.millis)} ms (bound asserted ${SILENT_POSTGRES_BOUND_MILLIS} ms); a cached key: 200 meanwhile; the uncached key 200 again ${Math.round(servedAgainMillis)} ms after Postgres answered (the idle connections that had gone mute were closed with the first one found)`,
        lost: 'nothing: no key refused as invalid while Postgres was silent',
        test: 'test/reliability/faults/postgres.int.test.ts',
      })
    } finally {
      // First: closing the pool waits for each connection's goodbye, which a connection that
      // went mute while idle never gives; closing the relay destroys them.
      await relay.close()
      await gateway.close()
      await pets.close()
    }
  }, 60_000)
})

/**
 * Postgres answering, but refusing every new connection: an operator's maintenance switch, and on
 * a Unix socket the server gone with its socket file. Both answered 500 internal_error with a
 * stack in the log, as if the services had a defect, and a service started meanwhile exited.
 */
describe('Postgres refusing new connections for now', () => {
  const database = suiteDatabase()

  it('ALLOW_CONNECTIONS false: creates and reads get 503 service_unavailable with Retry-After, a key not in the cache too, /readyz says why, and all is served once it is lifted', async () => {
    const pets = await startPetsService(database.url)
    const gateway = await startGateway({ databaseUrl: database.url, petsUrl: pets.url })
    const admin = new pg.Client({ connectionString: inject('postgresAdminUrl') })
    await admin.connect()
    const name = pg.escapeIdentifier(new URL(database.url).pathname.slice(1))
    try {
      const cached = await gateway.createKey({ name: 'cached', plan: 'enterprise', perMinute: 100_000 })
      const uncached = await gateway.createKey({ name: 'uncached' })
      await gateway.announced(cached.key, uncached.key)
      expect((await gateway.request('/v1/pets', { key: cached.key })).status).toBe(200)

      await admin.query(`ALTER DATABASE ${name} ALLOW_CONNECTIONS false`)
      await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1', [new URL(database.url).pathname.slice(1)])
      const answers = [
        await gateway.request('/v1/pets', { key: cached.key }),
        await gateway.request('/v1/pets', { key: cached.key, method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"name":"Rex","categoryId":1}' }),
        await gateway.request('/v1/pets', { key: uncached.key }),
      ]
      for (const answer of answers) {
        expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
        await expectErrorResponse(answer, 503, 'service_unavailable')
      }
      await expect(postgresAnswers(pets.pool)).rejects.toThrow('Postgres takes no connections to the database for now (SQLSTATE 55000')

      await admin.query(`ALTER DATABASE ${name} ALLOW_CONNECTIONS true`)
      await vi.waitFor(async () => expect((await gateway.request('/v1/pets', { key: uncached.key })).status).toBe(200), { timeout: 10_000, interval: 200 })
      const created = await gateway.request('/v1/pets', { key: cached.key, method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"name":"Rex","categoryId":1}' })
      expect(created.status).toBe(201)
      // The create refused during the fault stored nothing: this one is the only pet.
      const { rows } = await pets.pool.query<{ count: string }>('SELECT count(*) FROM pets.pets')
      expect(Number(rows[0]?.count)).toBe(1)
      recordScenario({
        area: 'Postgres',
        scenario: 'Postgres takes no new connections to the database (ALLOW_CONNECTIONS false, every connection ended)',
        answered: '503 service_unavailable with Retry-After for reads, creates and a key not in the cache; /readyz: `Postgres takes no connections to the database for now`; served again once lifted, without a restart',
        lost: 'nothing: the create refused meanwhile stored nothing',
        test: 'test/reliability/faults/postgres.int.test.ts',
      })
    } finally {
      await admin.query(`ALTER DATABASE ${name} ALLOW_CONNECTIONS true`)
      await admin.end()
      await gateway.close()
      await pets.close()
    }
  }, 60_000)

  it('a Unix socket folder without its socket (Postgres stopped): the pets-service answers 503 service_unavailable with Retry-After, and one starting waits for it', async () => {
    const folder = mkdtempSync(path.join(os.tmpdir(), 'no-postgres-'))
    const pool = createPool({ connectionString: `postgres://postgres@/test?host=${folder}`, applicationName: 'pets-service-test' })
    const app = await buildPetsService({
      pets: createPetRepository(pool, { preparedStatements: true }),
      internalToken: TEST_INTERNAL_TOKEN,
      logger: pino({ level: 'silent' }),
      registry: new Registry(),
    })
    try {
      for (const request of [
        { method: 'GET' as const, url: '/pets' },
        { method: 'POST' as const, url: '/pets', payload: { name: 'Rex', categoryId: 1 } },
      ]) {
        const answer = await app.inject({ ...request, headers: { 'x-internal-token': TEST_INTERNAL_TOKEN } })
        expect(answer.statusCode).toBe(503)
        expect(Number(answer.headers['retry-after'])).toBeGreaterThanOrEqual(1)
        expect(answer.json()).toMatchObject({ code: 'service_unavailable', status: 503 })
      }
      const warnings: string[] = []
      const logger = pino({ level: 'warn' }, { write: (line: string) => void warnings.push(line) })
      const waiting = waitForPostgres(pool, logger).then(
        () => 'answered',
        (error: Error) => error.message,
      )
      expect(await Promise.race([waiting, sleep(1_500).then(() => 'still waiting')])).toBe('still waiting')
      expect(warnings.join('')).toContain('waiting for Postgres at DATABASE_URL')
      expect(warnings.join('')).toContain('ENOENT')
    } finally {
      await app.close()
      await pool.end()
      rmSync(folder, { recursive: true, force: true })
    }
  }, 30_000)
})
