import { randomBytes } from 'node:crypto'
import { copyFileSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import pino from 'pino'
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { requirePostgresGrants, watchPostgresRefusals } from '../../common/src/database/privileges.ts'
import { GATEWAY_MIGRATIONS, GATEWAY_POSTGRES_NEEDS } from '../../gateway/src/migrations.ts'
import { PETS_MIGRATIONS, PETS_POSTGRES_NEEDS } from '../../pets-service/src/migrations.ts'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { goodbyeUnansweredRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { eventually } from '../gateway/rateLimit/httpLimits.ts'
import { baseEnv, exitWithin, freePort, killAll, runKeysCli, startNode, waitForReady, type NodeProcess } from '../scripts/processes.ts'
import { OPS_TEST_TOKEN, startGatewayProcess } from './gatewayProcess.ts'

/**
 * A role an operator (or a managed service) takes a privilege from while the services run:
 * a throwaway login role, not a superuser, on a throwaway database; both dropped afterwards.
 */
function throwawayRole(database: { readonly url: string }) {
  const name = `aas_test_role_${randomBytes(4).toString('hex')}`
  let admin: pg.Client | undefined
  const role = {
    name,
    /** DATABASE_URL for the services, logging in as the role (the test server trusts local logins). */
    get url() {
      const url = new URL(database.url)
      url.username = name
      return url.toString()
    },
    /** SQL as the superuser, on the test database. */
    async sql(text: string): Promise<pg.QueryResult> {
      return admin!.query(text.replaceAll('$role', `"${name}"`).replaceAll('$database', `"${new URL(database.url).pathname.slice(1)}"`))
    },
    /** Ends the role's own sessions (and no one else's): the next statement needs a new connection. */
    async endSessions(): Promise<void> {
      await admin!.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1', [name])
      // The services' pools hear of it a moment later, and drop those connections.
      await new Promise((resolve) => setTimeout(resolve, 300))
    },
  }
  beforeAll(async () => {
    admin = new pg.Client({ connectionString: database.url })
    await admin.connect()
    await admin.query(`CREATE ROLE "${name}" LOGIN`)
    // What the services need to migrate their own schema: it and its tables are then the role's.
    await role.sql('GRANT CREATE ON DATABASE $database TO $role')
  })
  afterAll(async () => {
    await admin?.end()
    // The database goes first (its own afterAll, registered before this one, runs after it: so drop it here).
    const server = new pg.Client({ connectionString: inject('postgresAdminUrl') })
    await server.connect()
    try {
      await server.query(`DROP DATABASE IF EXISTS "${new URL(database.url).pathname.slice(1)}" WITH (FORCE)`)
      await server.query(`DROP ROLE IF EXISTS "${name}"`)
    } finally {
      await server.end()
    }
  })
  return role
}

/** The process's log lines, parsed, since `from` in its output. */
function logLines(proc: NodeProcess, from = 0): { level: number; msg: string }[] {
  return proc
    .output()
    .slice(from)
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as { level: number; msg: string })
}

/** The lines at error level (pino's 50) or above. */
const errorLines = (proc: NodeProcess, from = 0) => logLines(proc, from).filter((line) => line.level >= 50)

/** The lines saying Postgres grants the role what requests need again. */
const grantedAgain = (proc: NodeProcess, from = 0) => logLines(proc, from).filter((line) => line.msg.includes('what requests need again'))

async function readyz(opsPort: number): Promise<{ status: number; body: { status?: string; reasons?: Record<string, string> } }> {
  const response = await fetch(`http://127.0.0.1:${opsPort}/readyz`, { signal: AbortSignal.timeout(3_000) })
  return { status: response.status, body: (await response.json()) as { status?: string; reasons?: Record<string, string> } }
}

async function readyzBecomes(opsPort: number, status: number, timeoutMillis = 10_000) {
  let last: Awaited<ReturnType<typeof readyz>> | undefined
  await eventually(async () => (last = await readyz(opsPort)).status === status, timeoutMillis).catch(() => {
    throw new Error(`/readyz did not answer ${status} within ${timeoutMillis} ms; last ${JSON.stringify(last)}`)
  })
  return last!
}

async function petsServiceProcess(databaseUrl: string) {
  const [port, opsPort] = [await freePort(), await freePort()]
  const env = {
    ...baseEnv(),
    LOG_LEVEL: 'info',
    DATABASE_URL: databaseUrl,
    INTERNAL_TOKEN: OPS_TEST_TOKEN,
    PETS_HOST: '127.0.0.1',
    PETS_PORT: String(port),
    PETS_OPS_HOST: '127.0.0.1',
    PETS_OPS_PORT: String(opsPort),
  }
  const proc = startNode('pets-service/src/main.ts', env)
  return { proc, port, opsPort }
}

const petsHeaders = { 'x-internal-token': OPS_TEST_TOKEN }

describe('a Postgres role that loses a privilege while the pets-service runs', () => {
  const database = suiteDatabase()
  const role = throwawayRole(database)
  let pets: Awaited<ReturnType<typeof petsServiceProcess>>
  let petId: number

  const list = () => fetch(`http://127.0.0.1:${pets.port}/pets`, { headers: petsHeaders })
  const get = () => fetch(`http://127.0.0.1:${pets.port}/pets/${petId}`, { headers: petsHeaders })
  const create = () =>
    fetch(`http://127.0.0.1:${pets.port}/pets`, {
      method: 'POST',
      headers: { ...petsHeaders, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'Rex', categoryId: 1 }),
    })

  beforeAll(async () => {
    pets = await petsServiceProcess(role.url)
    await waitForReady(`http://127.0.0.1:${pets.opsPort}/readyz`, pets.proc, 30_000)
    petId = ((await (await create()).json()) as { id: number }).id
  }, 40_000)
  afterAll(killAll)

  it.each([
    ['SELECT and INSERT on the pets table revoked', 'REVOKE SELECT, INSERT ON pets.pets FROM $role', 'GRANT SELECT, INSERT ON pets.pets TO $role', 'GRANT SELECT, INSERT ON TABLE pets.pets TO'],
    ['USAGE on its schema revoked', 'REVOKE USAGE ON SCHEMA pets FROM $role', 'GRANT USAGE ON SCHEMA pets TO $role', 'GRANT USAGE ON SCHEMA pets TO'],
    ['CONNECT on the database revoked (its sessions ended)', 'REVOKE CONNECT ON DATABASE $database FROM PUBLIC, $role', 'GRANT CONNECT ON DATABASE $database TO PUBLIC', 'GRANT CONNECT ON DATABASE'],
    ['its login taken away (NOLOGIN, its sessions ended)', 'ALTER ROLE $role NOLOGIN', 'ALTER ROLE $role LOGIN', 'not permitted to log in'],
  ])('%s: list, get and create are answered 503 with Retry-After, one error line names the fix, /readyz is not ready; all mend once it is granted back', async (_fault, revoke, restore, fix) => {
    const mark = pets.proc.output().length
    await role.sql(revoke)
    await role.endSessions()
    try {
      for (let round = 0; round < 3; round++) {
        for (const [name, request] of [['list', list], ['get', get], ['create', create]] as const) {
          const answer = await request()
          const body = (await answer.json()) as { code?: string }
          expect({ request: name, status: answer.status, code: body.code, retryAfter: Number(answer.headers.get('retry-after')) >= 1 })
            .toEqual({ request: name, status: 503, code: 'service_unavailable', retryAfter: true })
        }
      }
      const notReady = await readyzBecomes(pets.opsPort, 503)
      expect(notReady.body.status).toBe('not_ready')
      expect(notReady.body.reasons?.postgres).toContain(fix)
      await eventually(async () => errorLines(pets.proc, mark).length > 0, 5_000)
      const said = errorLines(pets.proc, mark)
      expect(said.map((line) => line.msg)).toHaveLength(1)
      expect(said[0]!.msg).toContain(fix)
    } finally {
      await role.sql(restore)
    }
    await readyzBecomes(pets.opsPort, 200)
    expect((await list()).status).toBe(200)
    expect((await get()).status).toBe(200)
    expect((await create()).status).toBe(201)
    expect(errorLines(pets.proc, mark)).toHaveLength(1)
    // Log lines leave in batches: the line may reach stdout a moment after /readyz says ready.
    await eventually(async () => grantedAgain(pets.proc, mark).length > 0, 5_000)
    expect(grantedAgain(pets.proc, mark)).toHaveLength(1)
  }, 40_000)

  // Nothing here asks /readyz: a service whose readiness nobody polls (npm start, systemd, a load
  // balancer checking the port only) must still end an episode once the grant is back, or a
  // second revoke is answered 503 without a line.
  it('a second revoke, after the grant came back with no one asking /readyz, has its own error line', async () => {
    const mark = pets.proc.output().length
    await role.sql('REVOKE SELECT, INSERT ON pets.pets FROM $role')
    try {
      expect((await list()).status).toBe(503)
      await eventually(async () => errorLines(pets.proc, mark).length === 1, 5_000)
    } finally {
      await role.sql('GRANT SELECT, INSERT ON pets.pets TO $role')
    }
    expect((await list()).status).toBe(200)
    await eventually(async () => grantedAgain(pets.proc, mark).length === 1, 25_000)
    const second = pets.proc.output().length
    await role.sql('REVOKE SELECT, INSERT ON pets.pets FROM $role')
    try {
      expect((await list()).status).toBe(503)
      await eventually(async () => errorLines(pets.proc, second).length === 1, 5_000).catch(() => {
        throw new Error(`the second revoke was answered 503 without an error line: ${JSON.stringify(logLines(pets.proc, mark).map((line) => line.msg))}`)
      })
      expect(errorLines(pets.proc, second)[0]!.msg).toContain('GRANT SELECT, INSERT ON TABLE pets.pets TO')
    } finally {
      await role.sql('GRANT SELECT, INSERT ON pets.pets TO $role')
    }
  }, 40_000)
})

describe('a Postgres role lacking a privilege at start', () => {
  const database = suiteDatabase()
  const role = throwawayRole(database)
  afterEach(killAll)

  it('the pets-service exits 1 with one line naming the grant, when its role may not read the pets table', async () => {
    const first = await petsServiceProcess(role.url)
    await waitForReady(`http://127.0.0.1:${first.opsPort}/readyz`, first.proc, 30_000)
    first.proc.kill()
    await role.sql('REVOKE SELECT ON pets.pets FROM $role')
    try {
      const pets = await petsServiceProcess(role.url)
      expect(await exitWithin(pets.proc, 30_000)).toEqual({ code: 1, signal: null })
      expect(pets.proc.output()).toContain('pets-service cannot start: cannot use Postgres at DATABASE_URL')
      expect(pets.proc.output()).toContain(`GRANT SELECT ON TABLE pets.pets TO "${role.name}"`)
    } finally {
      await role.sql('GRANT SELECT ON pets.pets TO $role')
    }
  }, 60_000)

  it('the gateway exits 1 with one line naming the grant, when its role may not create its schema', async () => {
    await role.sql('REVOKE CREATE ON DATABASE $database FROM $role')
    const upstream = await recordingUpstream()
    try {
      const gateway = startGatewayProcess({ databaseUrl: role.url, petsUrl: upstream.url, readyTimeoutMillis: 30_000 })
      await expect(gateway).rejects.toThrow(/exited \(code 1/)
      const output = String(await gateway.catch((error: unknown) => error))
      expect(output).toContain('gateway cannot start: cannot use Postgres at DATABASE_URL')
      expect(output).toContain(`GRANT CREATE ON DATABASE "${new URL(database.url).pathname.slice(1)}" TO "${role.name}"`)
    } finally {
      await upstream.close()
      await role.sql('GRANT CREATE ON DATABASE $database TO $role')
    }
  }, 60_000)
  // README's table is what the gateway's role needs at start. Migration 014 creates a trigger on
  // gateway.api_keys, which takes TRIGGER on it: a role holding everything the table listed, and
  // not that, could not start the version that brings 014, and was told only to 'grant the role
  // what Postgres names'.
  it('the gateway names the grant a migration of an upgrade needs, TRIGGER on api_keys, and starts once it is given', async () => {
    const previous = mkdtempSync(path.join(os.tmpdir(), 'aas-gateway-migrations-'))
    for (const file of readdirSync(GATEWAY_MIGRATIONS.directory).filter((name) => Number(name.slice(0, 3)) <= 12)) {
      copyFileSync(path.join(GATEWAY_MIGRATIONS.directory, file), path.join(previous, file))
    }
    const pool = createPool({ connectionString: role.url, applicationName: 'upgrade-grants-test', max: 2 })
    try {
      // The schema as the version before 013 left it, made by the role (it owns it), then TRIGGER taken.
      await migrate(pool, { ...GATEWAY_MIGRATIONS, directory: previous })
      await role.sql('REVOKE TRIGGER ON gateway.api_keys FROM $role')
      const upgrade = () => requirePostgresGrants(pool, GATEWAY_POSTGRES_NEEDS, () => migrate(pool, GATEWAY_MIGRATIONS))
      await expect(upgrade()).rejects.toThrow(`GRANT TRIGGER ON TABLE gateway.api_keys TO "${role.name}"`)
      await role.sql('GRANT TRIGGER ON gateway.api_keys TO $role')
      await upgrade()
      expect((await pool.query(`SELECT count(*)::int AS n FROM pg_trigger WHERE tgname = 'api_keys_truncated'`)).rows[0].n).toBe(1)
    } finally {
      await pool.end()
      rmSync(previous, { recursive: true, force: true })
    }
  }, 60_000)
})

describe('a Postgres role that loses a privilege while the gateway runs', () => {
  const database = suiteDatabase()
  const role = throwawayRole(database)
  let upstream: TestUpstream
  let gateway: Awaited<ReturnType<typeof startGatewayProcess>>
  let admin: pg.Pool
  let cliEnv: NodeJS.ProcessEnv

  beforeAll(async () => {
    upstream = await recordingUpstream()
    gateway = await startGatewayProcess({ databaseUrl: role.url, petsUrl: upstream.url, readyTimeoutMillis: 30_000, env: { LOG_LEVEL: 'info' } })
    admin = createPool({ connectionString: database.url, applicationName: 'privileges-test' })
    cliEnv = { ...baseEnv(), DATABASE_URL: role.url }
  }, 40_000)
  afterAll(async () => {
    await killAll()
    gateway?.cleanup()
    await admin?.end()
    await upstream?.close()
  })

  const newKey = async () => {
    const { key } = await createKeyRepository(admin).create({ name: `k-${generateApiKey().slice(-6)}`, plan: 'free' })
    return key
  }
  const call = (key: string) => fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })

  it('a key not in the cache is answered 503 with Retry-After while SELECT on the keys table is revoked, one error line names the grant, /readyz is not ready; all mend once granted back', async () => {
    const mark = gateway.proc.output().length
    await role.sql('REVOKE SELECT ON gateway.api_keys FROM $role')
    const keys = [await newKey(), await newKey(), await newKey()]
    try {
      for (const key of keys) {
        const answer = await call(key)
        const body = (await answer.json()) as { code?: string }
        expect({ status: answer.status, code: body.code, retryAfter: Number(answer.headers.get('retry-after')) >= 1 })
          .toEqual({ status: 503, code: 'service_unavailable', retryAfter: true })
      }
      const notReady = await readyzBecomes(gateway.opsPort, 503)
      expect(notReady.body.status).toBe('not_ready')
      expect(notReady.body.reasons?.postgres).toContain(`GRANT SELECT ON TABLE gateway.api_keys TO "${role.name}"`)
      await eventually(async () => errorLines(gateway.proc, mark).length > 0, 5_000)
      const said = errorLines(gateway.proc, mark)
      expect(said).toHaveLength(1)
      expect(said[0]!.msg).toContain(`GRANT SELECT ON TABLE gateway.api_keys TO "${role.name}"`)
    } finally {
      await role.sql('GRANT SELECT ON gateway.api_keys TO $role')
    }
    await readyzBecomes(gateway.opsPort, 200)
    for (const key of keys) expect((await call(key)).status).toBe(200)
    expect(errorLines(gateway.proc, mark)).toHaveLength(1)
    // Log lines leave in batches: the line may reach stdout a moment after /readyz says ready.
    await eventually(async () => grantedAgain(gateway.proc, mark).length > 0, 5_000)
    expect(grantedAgain(gateway.proc, mark)).toHaveLength(1)
  }, 40_000)

  it.each([
    ['SELECT on the keys table revoked', 'REVOKE SELECT ON gateway.api_keys FROM $role', 'GRANT SELECT ON gateway.api_keys TO $role', ['list'], 'GRANT SELECT ON TABLE gateway.api_keys TO'],
    ['CONNECT on the database revoked', 'REVOKE CONNECT ON DATABASE $database FROM PUBLIC, $role', 'GRANT CONNECT ON DATABASE $database TO PUBLIC', ['list'], 'GRANT CONNECT ON DATABASE'],
    ['INSERT on the change log revoked (creating a key writes to it)', 'REVOKE INSERT ON gateway.api_key_changes FROM $role', 'GRANT INSERT ON gateway.api_key_changes TO $role', ['create', '--name', 'cli', '--plan', 'free'], 'GRANT INSERT ON TABLE gateway.api_key_changes TO'],
  ])('the keys CLI says plainly what Postgres refuses and what to grant, with %s', async (_fault, revoke, restore, args, fix) => {
    await role.sql(revoke)
    try {
      const run = await runKeysCli(args, cliEnv, 30_000)
      expect(run.code).toBe(1)
      expect(run.stderr.trim().split('\n')).toHaveLength(1)
      expect(run.stderr).toContain('Postgres refuses')
      expect(run.stderr).toContain(fix)
    } finally {
      await role.sql(restore)
    }
  }, 40_000)
})

/**
 * A relay to Postgres that, for connections opened while `mute` is on, carries the login and then
 * nothing more from the server: a Postgres that stops answering mid-conversation, or a PgBouncer
 * that logs a client in and holds its query while the Postgres behind it is down.
 */
async function muteAfterLoginRelay(target: URL) {
  const state = { mute: false, opened: 0, closed: 0 }
  const sockets = new Set<net.Socket>()
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: target.hostname, port: Number(target.port || 5432) })
    sockets.add(client).add(upstream)
    state.opened++
    let closed = false
    for (const socket of [client, upstream]) {
      socket.on('error', () => undefined)
      socket.on('close', () => {
        if (!closed) state.closed++
        closed = true
        client.destroy()
        upstream.destroy()
      })
    }
    client.pipe(upstream)
    const mute = state.mute
    let loggedIn = false
    let unread = Buffer.alloc(0)
    upstream.on('data', (chunk: Buffer) => {
      if (loggedIn && mute) return
      unread = Buffer.concat([unread, chunk])
      while (unread.length >= 5 && unread.length >= 1 + unread.readInt32BE(1)) {
        const message = unread.subarray(0, 1 + unread.readInt32BE(1))
        unread = unread.subarray(message.length)
        if (!loggedIn || !mute) client.write(message)
        if (message[0] === 0x5a) loggedIn = true // ReadyForQuery: logged in
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const url = new URL(target)
  url.hostname = '127.0.0.1'
  url.port = String((server.address() as net.AddressInfo).port)
  const close = () => {
    for (const socket of sockets) socket.destroy()
    return new Promise((resolve) => server.close(resolve))
  }
  return { state, url: url.toString(), close }
}

describe('a Postgres refusal met while Postgres stops answering after the login', () => {
  const database = suiteDatabase()

  it('/readyz\'s check gives up within seconds and lets its connection go, and the episode still has its error line', async () => {
    const relay = await muteAfterLoginRelay(new URL(database.url))
    const pool = createPool({ connectionString: relay.url, applicationName: 'privileges-test' })
    const lines: { level: number; msg: string }[] = []
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as { level: number; msg: string }) })
    try {
      await migrate(pool, PETS_MIGRATIONS)
      const watch = watchPostgresRefusals(pool, PETS_POSTGRES_NEEDS, logger)
      relay.state.mute = true
      expect(watch.report(Object.assign(new Error('permission denied for table pets'), { code: '42501' }))).toBe(true)
      const probed = await Promise.race([
        watch.probe().then(() => 'ready', () => 'not ready'),
        new Promise((resolve) => setTimeout(() => resolve('no answer within 20 s'), 20_000)),
      ])
      expect(probed).toBe('not ready')
      // The episode's explanation and the probe's: both let go (a recheck may have opened another since).
      const openedByThen = relay.state.opened
      expect(openedByThen).toBeGreaterThanOrEqual(2)
      await eventually(async () => relay.state.closed >= 2, 5_000).catch(() => {
        throw new Error(`${relay.state.opened - relay.state.closed} connections to the mute Postgres still held`)
      })
      await eventually(async () => lines.some((line) => line.level >= 50 && line.msg.includes('42501: permission denied for table pets')), 5_000)
    } finally {
      await pool.end()
      await relay.close()
    }
  }, 40_000)

  it('says the episode\'s error line, and /readyz answers, when Postgres stops answering as the explaining connection ends', async () => {
    const relay = await goodbyeUnansweredRelay(database.url)
    const pool = createPool({ connectionString: relay.url, applicationName: 'privileges-test' })
    const lines: { level: number; msg: string }[] = []
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as { level: number; msg: string }) })
    const direct = createPool({ connectionString: database.url, applicationName: 'privileges-test' })
    try {
      await migrate(direct, PETS_MIGRATIONS)
      const watch = watchPostgresRefusals(pool, PETS_POSTGRES_NEEDS, logger)
      expect(watch.report(Object.assign(new Error('permission denied for table pets'), { code: '42501' }))).toBe(true)
      // The check is answered (the role lacks nothing: granted back meanwhile); its goodbye is not.
      const probed = await Promise.race([
        watch.probe().then(() => 'ready', () => 'not ready'),
        new Promise((resolve) => setTimeout(() => resolve('no answer within 20 s'), 20_000).unref()),
      ])
      expect(probed).toBe('ready')
      await eventually(async () => lines.some((line) => line.level >= 50 && line.msg.includes('permission denied for table pets')), 5_000)
      expect(relay.state.goodbyes).toBeGreaterThanOrEqual(2)
    } finally {
      await direct.end()
      await pool.end()
      await relay.close()
    }
  }, 40_000)
})
