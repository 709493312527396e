import { createHash } from 'node:crypto'
import type pg from 'pg'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { generateApiKey, isWellFormedApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository, type NewApiKey } from '../../gateway/src/keys/keyRepository.ts'
import { OPS_TEST_TOKEN, startGatewayProcess, type GatewayProcess } from '../ops/gatewayProcess.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../helpers/redis.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import {
  baseEnv,
  exitWithin,
  freePort,
  killAll,
  runKeysCli,
  startNode,
  waitForReady,
  type CliRun,
  type NodeProcess,
} from '../scripts/processes.ts'

const TEST_FILE = 'test/security/keyLeak.int.test.ts'
/** Anything shaped like a key: the prefix and at least 16 base62 characters. */
const KEY_LIKE = /aas_[0-9A-Za-z]{16,}/

/** `npm run keys -- …` against the session's database. */
function keysCli(databaseUrl: string, ...args: string[]): Promise<CliRun> {
  return runKeysCli(args, { ...baseEnv(), DATABASE_URL: databaseUrl })
}

/**
 * What must never be written anywhere but the client's own hands: the key, the key without its
 * prefix, its base64 (a Basic header), and every 12-character stretch of its random body (so a
 * truncated or re-prefixed copy is caught too; 12 base62 characters never occur by chance).
 */
function secretsOf(key: string): string[] {
  const body = key.slice(4, 36)
  const stretches = Array.from({ length: body.length - 11 }, (_, start) => body.slice(start, start + 12))
  return [key, key.slice(4), Buffer.from(key).toString('base64'), ...stretches]
}

interface Answer {
  what: string
  status: number
  headers: Headers
  body: string
  /** Sent with a key the gateway accepts (its answer is that client's own). */
  authenticated: boolean
}

describe('no API key in any log, metric, Redis key or stored row', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  let pool: pg.Pool
  let pets: NodeProcess
  let petsUrl: string
  let petsOpsUrl: string
  let gateway: GatewayProcess & { cleanup(): void }
  const cliRuns: CliRun[] = []
  let created: CliRun

  beforeAll(async () => {
    pool = createPool({ connectionString: database.url, applicationName: 'security-test', max: 2 })
    const [petsPort, petsOpsPort] = [await freePort(), await freePort()]
    // Every process logs at its most talkative level: no line may carry a key.
    pets = startNode('pets-service/src/main.ts', {
      ...baseEnv(),
      LOG_LEVEL: 'trace',
      DATABASE_URL: database.url,
      INTERNAL_TOKEN: OPS_TEST_TOKEN,
      PETS_HOST: '127.0.0.1',
      PETS_PORT: String(petsPort),
      PETS_OPS_HOST: '127.0.0.1',
      PETS_OPS_PORT: String(petsOpsPort),
    })
    petsUrl = `http://127.0.0.1:${petsPort}`
    petsOpsUrl = `http://127.0.0.1:${petsOpsPort}`
    // The operator issues the session's key with the CLI while the services start.
    const creating = keysCli(database.url, 'create', '--plan', 'pro', '--name', 'session', '--json')
    await waitForReady(`${petsOpsUrl}/readyz`, pets, 30_000)
    gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl,
      env: { REDIS_URL: TEST_REDIS_URL, LOG_LEVEL: 'trace' },
      configure: (file) => {
        file.redis.keyPrefix = prefix
        file.redis.commandTimeoutMillis = 1_000
        file.anonymous.perMinute = 60
        file.bans = { strikes: 2, ladder: ['60s'] }
      },
      readyTimeoutMillis: 30_000,
    })
    created = await creating
  })
  afterAll(async () => {
    await killAll()
    gateway?.cleanup()
    await pool?.end()
  })

  it('a whole session of valid, malformed, unknown, revoked and expired keys leaves only hashes behind', { timeout: 90_000 }, async () => {
    const answers: Answer[] = []
    async function send(what: string, path: string, init: RequestInit & { key?: string; authenticated?: boolean } = {}) {
      const { key, authenticated = false, ...rest } = init
      const headers = new Headers(rest.headers)
      if (key !== undefined) headers.set('authorization', `Bearer ${key}`)
      const response = await fetch(`${gateway.url}${path}`, { ...rest, headers, signal: AbortSignal.timeout(15_000) })
      const answer = { what, status: response.status, headers: response.headers, body: await response.text(), authenticated }
      answers.push(answer)
      return answer
    }
    const json = (body: unknown, key?: string): RequestInit & { key?: string } => ({
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: typeof body === 'string' ? body : JSON.stringify(body),
      key,
    })

    // The session's key was issued by the CLI (beforeAll); the others through the same repository.
    expect(created.code, created.stderr).toBe(0)
    const valid = JSON.parse(created.stdout) as { id: string; key: string }
    expect(isWellFormedApiKey(valid.key)).toBe(true)
    // Printed once, at creation, and nowhere else.
    expect(created.stdout.split(valid.key)).toHaveLength(2)
    const repository = createKeyRepository(pool)
    const issue = async (input: NewApiKey) => {
      const { record, key } = await repository.create(input)
      return { id: record.id, key }
    }
    const revoked = await issue({ name: 'to revoke', plan: 'free' })
    const hammer = await issue({ name: 'hammer', plan: 'enterprise', perMinute: 3, perDay: 100 })
    const expired = await issue({ name: 'expired', plan: 'free', expiresAt: new Date(Date.now() - 1_000) })
    const issued = [valid, revoked, hammer, expired]
    const unknown = generateApiKey()
    const flipped = (key: string, at: number) => key.slice(0, at) + (key[at] === 'A' ? 'B' : 'A') + key.slice(at + 1)
    const brokenChecksum = flipped(valid.key, valid.key.length - 1)
    const truncated = valid.key.slice(0, -3)
    const allKeys = [valid.key, revoked.key, hammer.key, expired.key, unknown, brokenChecksum, truncated]

    // 1. The valid key, and the key itself where it does not belong: paths, query, bodies, headers.
    expect((await send('list pets', '/v1/pets', { key: valid.key, authenticated: true })).status).toBe(200)
    expect((await send('create a pet', '/v1/pets', { ...json({ name: 'Rex', categoryId: 1 }, valid.key), authenticated: true })).status).toBe(201)
    const expectations: [string, string, RequestInit & { key?: string; authenticated?: boolean }, number][] = [
      ['key in the path', `/v1/pets/${valid.key}`, { key: valid.key, authenticated: true }, 400],
      ['key as a route', `/v1/${valid.key}`, { key: valid.key, authenticated: true }, 404],
      ['key in the query, with the key', `/v1/pets?api_key=${valid.key}`, { key: valid.key, authenticated: true }, 400],
      ['key in an unknown body field', '/v1/pets', { ...json({ name: 'Rex', categoryId: 1, apiKey: valid.key }, valid.key), authenticated: true }, 400],
      ['key as an invalid name', '/v1/pets', { ...json({ name: valid.key, categoryId: -1 }, valid.key), authenticated: true }, 400],
      ['key in a body that is not JSON', '/v1/pets', { ...json(`{"name": "${valid.key}`, valid.key), authenticated: true }, 400],
      ['key as the Idempotency-Key', '/v1/pets', { ...json({ name: 'Ida', categoryId: 1 }, valid.key), headers: { 'content-type': 'application/json', 'idempotency-key': valid.key }, authenticated: true }, 201],
      ['key in X-Forwarded-For', '/v1/pets', { key: valid.key, headers: { 'x-forwarded-for': valid.key }, authenticated: true }, 200],
      ['key in X-Consumer-Id', '/v1/pets', { key: valid.key, headers: { 'x-consumer-id': valid.key }, authenticated: true }, 200],
      ['key as the request id', '/v1/pets', { key: valid.key, headers: { 'x-request-id': valid.key }, authenticated: true }, 200],
      ['key without its prefix as the request id', '/v1/pets', { key: valid.key, headers: { 'x-request-id': valid.key.slice(4) }, authenticated: true }, 200],
      ['orders, not implemented', '/v1/store/orders', { key: valid.key, authenticated: true }, 501],
      ['missing pet', '/v1/pets/999999', { key: valid.key, authenticated: true }, 404],
      ['key in the query only', `/v1/pets?api_key=${valid.key}`, {}, 401],
      ['key as a Basic credential', '/v1/pets', { headers: { authorization: `Basic ${Buffer.from(`${valid.key}:`).toString('base64')}` } }, 401],
      ['key without the Bearer scheme', '/v1/pets', { headers: { authorization: valid.key } }, 401],
    ]
    for (const [what, path, init, status] of expectations) expect((await send(what, path, init)).status, what).toBe(status)
    // A well-formed X-Request-Id is echoed and logged; one that looks like a key is replaced.
    for (const what of ['key as the request id', 'key without its prefix as the request id']) {
      expect(answers.find((answer) => answer.what === what)?.headers.get('x-request-id'), what).toMatch(/^[0-9a-f-]{36}$/)
    }

    // 2. Keys the gateway must refuse: malformed, unknown, revoked, expired.
    const revokedRun = await keysCli(database.url, 'revoke', revoked.id, '--json')
    expect(revokedRun.code, revokedRun.stderr).toBe(0)
    await vi.waitFor(async () => expect((await send('revoked key', '/v1/pets', { key: revoked.key })).status).toBe(401), {
      timeout: 2_000,
      interval: 100,
    })
    for (const key of [brokenChecksum, truncated, unknown, revoked.key, expired.key]) {
      for (const [path, init] of [
        ['/v1/pets', {}],
        [`/v1/pets/${key}`, {}],
        ['/v1/pets', json({ name: key, categoryId: 1 })],
        ['/v1/pets', { headers: { 'x-forwarded-for': key } }],
      ] as [string, RequestInit][]) {
        const answer = await send(`refused key ${key === unknown ? 'unknown' : key.length}`, path, { ...init, key })
        expect(answer.status, `${path} ${answer.body}`).toBe(401)
        expect(JSON.parse(answer.body)).toMatchObject({ code: 'invalid_api_key' })
      }
    }

    // 3. A 429 and a ban for the hammering key (3 a minute, a ban after 2 strikes).
    const hammered: number[] = []
    const codes: string[] = []
    for (let i = 0; i < 8 && !codes.includes('api_key_banned'); i++) {
      const answer = await send('hammer', '/v1/pets', { key: hammer.key, authenticated: true })
      hammered.push(answer.status)
      if (answer.status === 429) codes.push((JSON.parse(answer.body) as { code: string }).code)
    }
    expect(hammered.slice(0, 3)).toEqual([200, 200, 200])
    expect(codes).toContain('rate_limited')
    expect(codes.at(-1)).toBe('api_key_banned')

    // 4. Anonymous 429s: X-Forwarded-For (here carrying keys) from an untrusted peer mints no bucket.
    let anonymousAdmitted = 0
    let firstLimited = -1
    for (let i = 0; i < 70 && firstLimited === -1; i++) {
      const answer = await send('anonymous', '/v1/pets', { headers: { 'x-forwarded-for': i % 2 ? allKeys[i % allKeys.length]! : `198.51.100.${i}` } })
      if (answer.status === 429) firstLimited = i
      else anonymousAdmitted++
    }
    expect(firstLimited).toBeGreaterThan(-1)
    // Every refusal so far came from this one peer, whatever it claimed: one bucket of 60.
    const anonymousRefused = answers.filter((answer) => answer.status === 401).length
    for (let i = 0; i < 5; i++) {
      expect((await send('anonymous after the limit', '/v1/pets', { headers: { 'x-forwarded-for': `203.0.113.${i}` } })).status).toBe(429)
    }

    // 5. Someone who skips the gateway: the pets-service refuses anyone without the internal token.
    const directAttempts: [string, RequestInit][] = [
      ['GET with the API key as bearer', { headers: { authorization: `Bearer ${valid.key}` } }],
      ['GET with the API key as the internal token', { headers: { 'x-internal-token': valid.key } }],
      ['GET with a guessed internal token of the right length', { headers: { 'x-internal-token': 'x'.repeat(OPS_TEST_TOKEN.length) } }],
      ['GET with no credential', {}],
      ['POST with the API key', { ...json({ name: 'Sneaky', categoryId: 1 }, undefined), headers: { 'content-type': 'application/json', authorization: `Bearer ${valid.key}` } }],
    ]
    for (const [what, init] of directAttempts) {
      const direct = await fetch(`${petsUrl}/pets`, init)
      expect(direct.status, what).toBe(401)
      expect(await direct.json()).toEqual({ code: 'unauthorized', message: expect.any(String), status: 401 })
    }
    const sneaked = await pool.query("SELECT count(*)::int AS n FROM pets.pets WHERE name = 'Sneaky'")
    expect(sneaked.rows[0].n).toBe(0)

    // 6. The CLI's list and show: never the key.
    cliRuns.push(...(await Promise.all([
      keysCli(database.url, 'list'),
      keysCli(database.url, 'list', '--json'),
      keysCli(database.url, 'show', valid.id),
      keysCli(database.url, 'show', revoked.id, '--json'),
    ])), revokedRun)
    for (const run of cliRuns) expect(run.code, run.stderr).toBe(0)

    // 7. Metrics from both ops ports, then an upstream error: the pets-service stops (its log flushed).
    const petsMetrics = await (await fetch(`${petsOpsUrl}/metrics`)).text()
    pets.child.kill('SIGTERM')
    expect((await exitWithin(pets, 20_000)).code).toBe(0)
    for (const init of [{ key: valid.key, authenticated: true }, { ...json({ name: 'Rex', categoryId: 1 }, valid.key), authenticated: true }]) {
      const answer = await send('upstream down', '/v1/pets', init)
      expect(answer.status).toBe(502)
    }
    const gatewayMetrics = await (await fetch(`${gateway.opsUrl}/metrics`)).text()
    expect(gatewayMetrics).toMatch(/gateway_auth_failures_total\{reason="unknown"\} [1-9]/)
    expect(gatewayMetrics).toMatch(/gateway_bans_total\{[^}]*\} 1/)
    expect(gatewayMetrics).toMatch(/gateway_upstream_errors_total\{[^}]*\} [1-9]/)

    // 8. Every Redis key the gateway wrote (names and values), and any name on the server holding one of these keys.
    const redis = new Redis(TEST_REDIS_URL)
    const redisNames: string[] = []
    const redisValues: string[] = []
    const everyName: string[] = []
    try {
      let cursor = '0'
      do {
        const [next, names] = await redis.scan(cursor, 'COUNT', 1000)
        cursor = next
        everyName.push(...names)
      } while (cursor !== '0')
      for (const name of everyName.filter((candidate) => candidate.startsWith(prefix))) {
        redisNames.push(name)
        const type = await redis.type(name)
        if (type === 'string') redisValues.push(((await redis.getBuffer(name)) ?? Buffer.alloc(0)).toString('latin1'))
        else if (type === 'hash') redisValues.push(JSON.stringify(await redis.hgetall(name)))
        else redisValues.push(((await redis.dumpBuffer(name)) ?? Buffer.alloc(0)).toString('latin1'))
      }
    } finally {
      redis.disconnect()
    }
    // The windows of the admitted keys are there, under their public ids, and per-IP buckets.
    expect(redisNames.some((name) => name.includes(valid.id))).toBe(true)
    expect(redisNames.some((name) => name.includes(hammer.id))).toBe(true)
    expect(redisNames.some((name) => name.includes('anon'))).toBe(true)

    // 9. What Postgres keeps: the hash, a 10-character display prefix, never more.
    const rows = (await pool.query<Record<string, unknown>>('SELECT * FROM gateway.api_keys')).rows
    const changes = (await pool.query<Record<string, unknown>>('SELECT * FROM gateway.api_key_changes')).rows
    expect(rows).toHaveLength(4)
    for (const { id, key } of issued) {
      const row = rows.find((candidate) => candidate.id === id)
      expect(row?.key_hash).toEqual(createHash('sha256').update(key).digest())
      expect(row?.display_prefix).toBe(key.slice(0, 10))
    }
    const stored = [...rows, ...changes]
      .flatMap((row) => Object.values(row))
      .map((value) => (Buffer.isBuffer(value) ? `${value.toString('hex')} ${value.toString('latin1')}` : String(value)))
      .join('\n')

    // 10. Every log line of every process, after a clean stop flushed them.
    gateway.proc.child.kill('SIGTERM')
    expect((await exitWithin(gateway.proc, 20_000)).code).toBe(0)
    const gatewayLog = gateway.proc.output()
    const petsLog = pets.output()
    expect(gatewayLog).toContain('"request completed"')
    expect(gatewayLog).toContain('upstream request failed')
    expect(petsLog).toContain('"request completed"')
    const requestsLogged = (gatewayLog.match(/"request completed"/g) ?? []).length
    expect(requestsLogged).toBeGreaterThanOrEqual(answers.length)

    const places: [string, string][] = [
      ['gateway log', gatewayLog],
      ['pets-service log', petsLog],
      ['gateway /metrics', gatewayMetrics],
      ['pets-service /metrics', petsMetrics],
      ['Redis key names', redisNames.join('\n')],
      ['Redis values', redisValues.join('\n')],
      ['Redis key names, whole server', everyName.join('\n')],
      ['api_keys and api_key_changes rows', stored],
      ['keys CLI list/show/revoke', cliRuns.map((run) => `${run.stdout}\n${run.stderr}`).join('\n')],
      ['keys CLI create (stderr)', created.stderr],
    ]
    const leaks: string[] = []
    for (const [place, text] of places) {
      for (const key of allKeys) {
        for (const secret of secretsOf(key)) if (text.includes(secret)) leaks.push(`${place} holds ${secret === key ? 'a key' : 'part of a key'}`)
      }
      if (place !== 'Redis key names, whole server' && KEY_LIKE.test(text)) leaks.push(`${place} holds something shaped like a key: ${KEY_LIKE.exec(text)?.[0].slice(0, 10)}…`)
    }
    expect([...new Set(leaks)]).toEqual([])

    // 11. Every answer: Error bodies without internals; authenticated answers not cacheable.
    for (const answer of answers) {
      if (answer.authenticated) expect(answer.headers.get('cache-control'), `${answer.what}: ${answer.status}`).toBe('no-store')
      if (answer.status < 400) continue
      const error = JSON.parse(answer.body) as Record<string, unknown>
      expect(error, answer.what).toEqual({ code: expect.any(String), message: expect.any(String), status: answer.status })
      expect(answer.body, answer.what).not.toMatch(/\bat .+:\d+:\d+|node_modules|SELECT |INSERT |pets\.pets|ECONNREFUSED|undici|socket hang up/)
      for (const key of allKeys) expect(answer.body, answer.what).not.toContain(key.slice(4, 16))
    }

    const statuses = [...new Set(answers.map((answer) => answer.status))].sort().join(', ')
    recordScenario({
      area: 'Security',
      scenario:
        'A session through real gateway and pets-service processes: valid, malformed, unknown, revoked and expired keys; keys in paths, query, bodies, X-Forwarded-For, X-Request-Id; 401s, 429s, a ban, a 502; the keys CLI create/list/show/revoke',
      answered: `${answers.length} answers (${statuses}); revoked key refused after the CLI revoke; ban after ${hammered.length} requests; anonymous 429 after ${anonymousRefused} from one peer whatever its X-Forwarded-For`,
      lost: `nothing leaked: ${allKeys.length} keys (and every 12-character stretch of them) in none of ${requestsLogged} gateway log lines, the pets-service log, both /metrics, ${redisNames.length} Redis keys (names and values), ${rows.length} api_keys rows (SHA-256 and a 10-character prefix only) or the CLI output`,
      test: TEST_FILE,
    })
    recordScenario({
      area: 'Security',
      scenario: 'X-Forwarded-For from an untrusted peer, a new address (or a key) on every request, to mint fresh per-IP buckets',
      answered: `401 for the first ${anonymousRefused} requests of the session without a valid key (this test sets the per-IP limit to 60 a minute, twice the default; ${anonymousAdmitted} of them with a new X-Forwarded-For each), then 429 rate_limited, still 429 for 5 more new addresses`,
      lost: 'nothing: one bucket for the peer whatever it claimed; no key charged',
      test: TEST_FILE,
    })
    recordScenario({
      area: 'Security',
      scenario: 'A client skipping the gateway: calls the pets-service process directly with its API key, a guessed token, or nothing',
      answered: `401 unauthorized to all ${directAttempts.length} (GET and POST)`,
      lost: 'nothing written: no pet created by the refused POST',
      test: TEST_FILE,
    })
    recordScenario({
      area: 'Security',
      scenario: 'Every authenticated answer (200, 201, 400, 404, 429, 501, 502) and every Error body in that session',
      answered: `Cache-Control: no-store on all ${answers.filter((answer) => answer.authenticated).length} authenticated answers; ${answers.filter((answer) => answer.status >= 400).length} Error bodies of exactly code, message, status`,
      lost: 'nothing exposed: no stack trace, SQL, upstream error text or key in any Error body',
      test: TEST_FILE,
    })
  })
})
