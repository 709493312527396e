import { processIdentity } from '../../common/src/database/discoveryFile.ts'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import net from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { hashApiKey, isWellFormedApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository, type KeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { runKeysInProcess } from '../helpers/keysCli.ts'
import { goodbyeUnansweredRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { runKeysCli, type CliRun } from '../scripts/processes.ts'
import { eventually } from './rateLimit/httpLimits.ts'

const ANY_KEY = /aas_[0-9A-Za-z]{38}/g

/**
 * `npm run keys -- …`: its command line run in this process, which is the whole of it but the
 * process's own work; the tests of that (exit status, stdout's reader gone, exiting when done)
 * run the real entry point in a child process (runKeysCli).
 */
function keys(args: string[], env: NodeJS.ProcessEnv): Promise<CliRun> {
  return runKeysInProcess(args, env)
}

function cleanEnv(extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const env = { ...process.env }
  for (const name of ['DATABASE_URL', 'DATA_DIR', 'GATEWAY_CONFIG']) delete env[name]
  return { ...env, ...extra }
}

/** Exit 2 and two lines: what is wrong, and where the usage is (not the whole usage again). */
function expectUsageError(run: CliRun, message: string | RegExp) {
  expect(run.code, run.stderr).toBe(2)
  expect(run.stdout).toBe('')
  const [reason, hint, ...rest] = run.stderr.split('\n')
  expect(reason).toMatch(/^error: /)
  expect(reason).toMatch(message)
  expect(hint).toBe('`npm run keys -- --help` lists the commands and their options.')
  expect(rest).toEqual([''])
}

/** Exit 1 and one line: the command could not be done, though it was well formed. */
function expectFailure(run: CliRun, message: string | RegExp) {
  expect(run.code, run.stderr).toBe(1)
  expect(run.stdout).toBe('')
  expect(run.stderr).toMatch(/^error: [^\n]+\n$/)
  expect(run.stderr).toMatch(message)
}

describe('keys CLI (npm run keys)', () => {
  const database = suiteDatabase()
  let pool: pg.Pool
  let repository: KeyRepository
  const created: string[] = []
  const run = (...args: string[]) => keys(args, cleanEnv({ DATABASE_URL: database.url }))
  /** The CLI migrates on its own; tests that seed rows directly must not depend on an earlier test having run it. */
  const schema = () => migrate(pool, GATEWAY_MIGRATIONS)

  beforeAll(async () => {
    pool = createPool({ connectionString: database.url, applicationName: 'cli-test', max: 2 })
    repository = createKeyRepository(pool)
  })
  afterAll(async () => {
    await pool?.end()
  })

  // A primary demoted in a failover, default_transaction_read_only: Postgres answers, and the
  // operator is told that, not sent to check the network.
  // README: a password with / @ # % must be percent-encoded. Unencoded, the CLI blamed the schema.
  it('says DATABASE_URL does not parse and what to fix, not that the schema could not be prepared, exit 1', async () => {
    const refused = await keys(['list'], cleanEnv({ DATABASE_URL: 'postgres://app:pa/ss#w0rd@127.0.0.1:5432/pets' }))
    expectFailure(refused, /^error: DATABASE_URL holds an '@' after its host: percent-encode .*PGPASSWORD/)
    expect(refused.stderr).not.toContain('schema')
    expect(refused.stderr).not.toContain('w0rd')
  })

  // A server that answers the TLS request with "no" (pg: "The server does not support SSL
  // connections"): nothing was asked of the schema, and the CLI blamed it.
  it('says it cannot use Postgres, not that the schema could not be prepared, when the connection itself is refused', async () => {
    const server = net.createServer((socket) => socket.once('data', () => socket.end('N')))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const { port } = server.address() as net.AddressInfo
      const refused = await keys(['list'], cleanEnv({ DATABASE_URL: `postgres://app@127.0.0.1:${port}/pets?sslmode=no-verify` }))
      expectFailure(refused, /^error: cannot use Postgres at DATABASE_URL \(postgres:\/\/app@127\.0\.0\.1:\d+\/pets\?sslmode=no-verify\): The server does not support SSL connections\n$/)
    } finally {
      await new Promise((resolve) => server.close(resolve))
    }
  })

  it('says the database does not exist, not that the role lacks a privilege, when DATABASE_URL names one Postgres does not have', async () => {
    const url = new URL(database.url)
    url.pathname = '/no_such_database_here'
    const refused = await keys(['list'], cleanEnv({ DATABASE_URL: url.toString() }))
    expectFailure(refused, /^error: Postgres has no such database \(3D000: database "no_such_database_here" does not exist\): restore or rename the database "no_such_database_here", or point DATABASE_URL at the one the service uses \(Postgres at DATABASE_URL /)
  })

  it('as a process (npm run keys), answers as in-process runs do, with exit status 0, 1 or 2', async () => {
    await schema()
    const { record } = await repository.create({ name: 'as-a-process', plan: 'free' })
    const env = cleanEnv({ DATABASE_URL: database.url })
    for (const args of [['show', record.id, '--json'], ['show', 'key_nosuchkey00'], ['frobnicate'], ['--help']]) {
      const [asProcess, inProcess] = await Promise.all([runKeysCli(args, env, 20_000), runKeysInProcess(args, env)])
      expect(asProcess, args.join(' ')).toEqual(inProcess)
    }
    const codes = await Promise.all([['show', record.id], ['show', 'key_nosuchkey00'], ['frobnicate']].map((args) => runKeysCli(args, env, 20_000)))
    expect(codes.map((run) => run.code)).toEqual([0, 1, 2])
  })

  it('exits once its command is done when Postgres stops answering as the CLI closes its connections', async () => {
    await schema()
    const { record } = await repository.create({ name: 'mute-goodbye', plan: 'free' })
    const relay = await goodbyeUnansweredRelay(database.url)
    try {
      // Killed at 15 s if it still waits: code null.
      const listed = await runKeysCli(['list', '--json'], cleanEnv({ DATABASE_URL: relay.url }), 15_000)
      expect(listed.code, listed.stderr).toBe(0)
      expect((JSON.parse(listed.stdout) as { keys: { id: string }[] }).keys.map((key) => key.id)).toContain(record.id)
      expect(relay.state.goodbyes).toBeGreaterThanOrEqual(1)
    } finally {
      await relay.close()
    }
  })

  it('says Postgres takes no writes, not that it cannot be reached, when the database is read-only', async () => {
    await schema()
    const { record } = await repository.create({ name: 'read-only', plan: 'free' })
    const name = new URL(database.url).pathname.slice(1)
    // One connection, opened before: the pool's later ones would be read-only too.
    const admin = await pool.connect()
    await admin.query(`ALTER DATABASE "${name}" SET default_transaction_read_only = on`)
    try {
      const [revoke, list] = await Promise.all([run('revoke', record.id), run('list', '--json')])
      for (const refused of [revoke, list]) expectFailure(refused, /^error: Postgres takes no writes for now \(read-only\) at DATABASE_URL .*read-only transaction\n$/)
    } finally {
      await admin.query(`ALTER DATABASE "${name}" RESET default_transaction_read_only`)
      admin.release()
    }
  })

  it('creates a key on a fresh database and prints it once; the printed key is the stored one', async () => {
    const [text, json] = await Promise.all([
      run('create', '--plan', 'pro', '--name', 'acme'),
      run('create', '--plan', 'enterprise', '--name', 'big co', '--per-minute', '5000', '--per-day', '2000000', '--expires', '30d', '--json'),
    ])

    expect(text.code, text.stderr).toBe(0)
    expect(text.stderr).toBe('')
    const printed = text.stdout.match(ANY_KEY) ?? []
    expect(printed).toHaveLength(1)
    const key = printed[0] as string
    expect(isWellFormedApiKey(key)).toBe(true)
    expect(text.stdout).toMatch(/cannot be shown again/)
    const record = await repository.findByHash(hashApiKey(key))
    expect(record).toMatchObject({ name: 'acme', plan: 'pro', perMinute: null, perDay: null, expiresAt: null, revokedAt: null })
    expect(text.stdout).toContain(record?.id)

    expect(json.code, json.stderr).toBe(0)
    const body = JSON.parse(json.stdout) as Record<string, unknown>
    expect(json.stdout.trim().split('\n')).toHaveLength(1)
    expect(body).toMatchObject({ name: 'big co', plan: 'enterprise', perMinute: 5000, perDay: 2000000, state: 'active' })
    expect(typeof body.id).toBe('string')
    expect(isWellFormedApiKey(String(body.key))).toBe(true)
    const expiresIn = Date.parse(String(body.expiresAt)) - Date.parse(String(body.createdAt))
    expect(expiresIn, "30d counts from createdAt, to the millisecond").toBe(30 * 86_400_000)
    const stored = await repository.findByHash(hashApiKey(String(body.key)))
    expect(stored).toMatchObject({ id: body.id, perMinute: 5000, perDay: 2000000 })
    created.push(key, String(body.key))
  })

  it("creates a key without --name as DESIGN's example does, named \"unnamed\"", async () => {
    const json = await run('create', '--plan', 'enterprise', '--per-minute', '5000', '--per-day', '2000000', '--json')
    expect(json.code, json.stderr).toBe(0)
    const body = JSON.parse(json.stdout) as Record<string, unknown>
    expect(body).toMatchObject({ name: 'unnamed', plan: 'enterprise', perMinute: 5000, perDay: 2000000, state: 'active' })
    expect(await repository.findByHash(hashApiKey(String(body.key)))).toMatchObject({ id: body.id, name: 'unnamed' })
    created.push(String(body.key))
  })

  it('create --expires says in its confirmation when the key expires, read as the CLI parsed it', async () => {
    const [dated, lasting] = await Promise.all([
      run('create', '--plan', 'free', '--name', 'trial', '--expires', '2099-12-31T18:00+09:00'),
      run('create', '--plan', 'free', '--name', 'forever'),
    ])
    expect(dated.code, dated.stderr).toBe(0)
    expect(dated.stdout).toMatch(/^Created API key key_\w+ "trial" on plan free \(60\/min, 1,000\/day\), expiring 2099-12-31 09:00:00 UTC\.\n/)
    expect(lasting.code, lasting.stderr).toBe(0)
    expect(lasting.stdout).toMatch(/^Created API key key_\w+ "forever" on plan free \(60\/min, 1,000\/day\)\.\n/)
    created.push(...[dated, lasting].flatMap((printed) => printed.stdout.match(ANY_KEY) ?? []))
  })

  it('refuses bad arguments with exit 2, the reason in one line and a pointer to --help, and creates nothing', async () => {
    await schema()
    const before = await repository.count()
    const [enterprise, unknownPlan, unknownCommand, unknownOption, missingId, badExpiry] = await Promise.all([
      run('create', '--plan', 'enterprise', '--name', 'no limits', '--json'),
      run('create', '--plan', 'gold', '--name', 'x'),
      run('frobnicate', 'key_whatever'),
      run('list', '--verbose'),
      run('show'),
      run('create', '--plan', 'free', '--expires', 'tomorrow'),
    ])
    expectUsageError(enterprise, /plan "enterprise" has custom limits.*--per-minute.*--per-day/)
    expectUsageError(unknownPlan, /unknown plan "gold".*free, pro, business, enterprise/)
    expectUsageError(unknownCommand, /unknown command "frobnicate"/)
    // The whole reason: not Node's advice to pass '--verbose' after '--', which only led to "list takes no arguments".
    expectUsageError(unknownOption, /^error: list: Unknown option '--verbose'$/)
    expectUsageError(missingId, /show takes <id>, got none/)
    expectUsageError(badExpiry, /--expires must be a duration .* got "tomorrow"/)
    expect(await repository.count()).toBe(before)
  })

  it('prints the usage for --help (stdout, exit 0) and for a command line naming no command (stderr, exit 2)', async () => {
    const [help, none] = await Promise.all([run('--help'), run()])
    expect(help.code, help.stderr).toBe(0)
    expect(help.stdout).toMatch(/^Usage: npm run keys -- <command> \[options\]\n/)
    expect(help.stderr).toBe('')
    expect(none.code).toBe(2)
    expect(none.stdout).toBe('')
    expect(none.stderr).toMatch(/^error: no command given\n\nUsage: npm run keys -- <command> \[options\]\n/)
  })

  it('lists keys with prefix, plan, limits and state, never the key or its hash', async () => {
    await schema()
    const active = await repository.create({ name: 'listed', plan: 'free' })
    const revoked = await repository.create({ name: 'gone', plan: 'business' })
    await repository.revoke(revoked.record.id)
    const lapsed = await repository.create({ name: 'lapsed', plan: 'free', expiresInMillis: -1_000 })
    const secrets = [...created, active.key, revoked.key, lapsed.key]
    const hashes = secrets.map((key) => hashApiKey(key).toString('hex'))

    const [text, json] = await Promise.all([run('list'), run('list', '--json')])
    for (const output of [text, json]) {
      expect(output.code, output.stderr).toBe(0)
      expect(output.stderr).toBe('')
      expect(output.stdout.match(ANY_KEY)).toBeNull()
      for (const secret of [...secrets, ...hashes]) expect(output.stdout).not.toContain(secret)
    }
    const activeLine = text.stdout.split('\n').find((line) => line.startsWith(active.record.id))
    expect(activeLine).toContain(`${active.key.slice(0, 10)}…`)
    expect(activeLine).toMatch(/listed\s+free\s+60\/min, 1,000\/day\s+active/)
    expect(text.stdout.split('\n').find((line) => line.startsWith(revoked.record.id))).toMatch(/\brevoked\b/)

    const { keys: listed } = JSON.parse(json.stdout) as { keys: Record<string, unknown>[] }
    expect(listed.find((entry) => entry.id === active.record.id)).toMatchObject({
      prefix: active.key.slice(0, 10),
      plan: 'free',
      perMinute: 60,
      perDay: 1000,
      state: 'active',
    })
    expect(listed.find((entry) => entry.id === revoked.record.id)).toMatchObject({ state: 'revoked' })
    // An operator reads STATE and revokedAt to know which keys still work.
    expect(text.stdout.split('\n').find((line) => line.startsWith(lapsed.record.id))).toMatch(/\bexpired\b/)
    expect(listed.find((entry) => entry.id === lapsed.record.id)).toMatchObject({ state: 'expired', revokedAt: null })
    expect(listed.find((entry) => entry.id === active.record.id)).toMatchObject({ revokedAt: null, expiresAt: null })
    const revokedAt = (await repository.findById(revoked.record.id))?.revokedAt
    expect(listed.find((entry) => entry.id === revoked.record.id)?.revokedAt).toBe(revokedAt?.toISOString())
    expect(listed.every((entry) => !('key' in entry) && !('hash' in entry) && !('keyHash' in entry))).toBe(true)
  })

  it('names every problem of a config it cannot use in one readable line, exit 1', async () => {
    const folder = await mkdtemp(path.join(tmpdir(), 'keys-cli-config-'))
    try {
      const config = path.join(folder, 'gateway.yaml')
      await writeFile(config, 'plans:\n  free: { perMinute: many, perDay: 1 }\nwindows: 3\n')
      const refused = await keys(['list'], cleanEnv({ DATABASE_URL: database.url, GATEWAY_CONFIG: config }))
      expectFailure(refused, /^error: invalid gateway config: \S+gateway\.yaml:\d+: server is required; /)
      expect(refused.stderr).toMatch(/; \S+gateway\.yaml:2: plans\.free\.perMinute must be a positive integer.*; \S+gateway\.yaml:3: windows must be object\n$/)
      // Its line breaks were printed escaped, as \u000a.
      expect(refused.stderr).not.toContain('\\u')
    } finally {
      await rm(folder, { recursive: true, force: true })
    }
  })

  it('reads only the plans of the config: a gateway variable set wrong in the same shell stops no command', async () => {
    // A process of its own: whatever reads the process's environment, not only what the CLI is given, must let it be.
    await schema()
    const env = cleanEnv({ DATABASE_URL: database.url, GATEWAY_PORT: '99999', GATEWAY_TLS_CERT_FILE: '/nowhere/server.crt', REDIS_PASSWORD: 'alone' })
    const [created, listed] = await Promise.all([runKeysCli(['create', '--plan', 'pro', '--name', 'gateway-env', '--json'], env, 20_000), runKeysCli(['list'], env, 20_000)])
    expect(created.code, created.stderr).toBe(0)
    expect(JSON.parse(created.stdout)).toMatchObject({ plan: 'pro', perMinute: 300, perDay: 10_000 })
    expect(listed.code, listed.stderr).toBe(0)
    expect(listed.stderr).not.toMatch(/\n\s+at /)
  })

  // `keys list | head`, a pager quit early, a reader that died: Unix tools stop quietly there.
  it('stops quietly with exit 0 when the reader of list or show goes away (keys list | head), with no stack trace', async () => {
    await schema()
    await pool.query(
      `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
       SELECT 'key_pipe' || lpad(g::text, 6, '0'), sha256(('pipe' || g)::bytea), 'aas_pipe00', 'piped ' || g, 'free'
         FROM generate_series(1, 3000) g`,
    )
    try {
      const env = cleanEnv({ DATABASE_URL: database.url })
      const runs = await Promise.all([
        runKeysCli(['list'], env, 20_000, 'first-chunk'),
        runKeysCli(['list', '--json'], env, 20_000, 'first-chunk'),
        runKeysCli(['show', 'key_pipe000001'], env, 20_000, 'gone'),
      ])
      for (const piped of runs) {
        expect(piped.stderr, piped.args.join(' ')).toBe('')
        expect(piped.code, piped.args.join(' ')).toBe(0)
      }
    } finally {
      await pool.query(`DELETE FROM gateway.api_keys WHERE id LIKE 'key_pipe%'`)
      await pool.query(`DELETE FROM gateway.api_key_changes WHERE key_id LIKE 'key_pipe%'`)
    }
  })

  // The change is made, but what it printed was lost: for create, the key itself.
  it('says in one line on stderr, exit 1, when a change was made but its output could not be written (stdout closed)', async () => {
    const run = await runKeysCli(['create', '--plan', 'free', '--name', 'unread'], cleanEnv({ DATABASE_URL: database.url }), 20_000, 'gone')
    expect(run.code, run.stderr).toBe(1)
    expect(run.stderr).toMatch(/^error: stdout was closed before the result was written[^\n]*\n$/)
    expect(run.stderr).toContain('create was done')
    expect(run.stderr).not.toMatch(ANY_KEY)
  })

  // Node reopens a closed stdout on /dev/null, where every write succeeds: the key was lost unsaid, exit 0.
  it('creates no key when stdout is closed or /dev/null, and says in one line on stderr how to get the key, exit 2', async () => {
    await schema()
    const env = cleanEnv({ DATABASE_URL: database.url })
    const runs = await Promise.all([
      runKeysCli(['create', '--plan', 'free', '--name', 'into-nothing'], env, 20_000, 'closed'),
      runKeysCli(['create', '--plan', 'free', '--name', 'into-nothing', '--json'], env, 20_000, 'dev-null'),
    ])
    for (const refused of runs) {
      expect(refused.code, refused.stderr).toBe(2)
      expect(refused.stderr).toMatch(/^error: stdout is closed or \/dev\/null, so the new key would be lost: no key was created\. [^\n]*`> key\.txt`[^\n]*--json[^\n]*\n$/)
    }
    const { rows } = await pool.query(`SELECT count(*)::int AS made FROM gateway.api_keys WHERE name = 'into-nothing'`)
    expect(rows[0].made).toBe(0)
    // Only create's output is a secret shown once: the other commands write to /dev/null as asked.
    const listed = await runKeysCli(['list'], env, 20_000, 'dev-null')
    expect(listed.code, listed.stderr).toBe(0)
    expect(listed.stderr).toBe('')
  })

  it('says in one line on stderr, exit 1, when its output could not be written to a full disk: a create names the key lost with it, a list that nothing was changed', async () => {
    const env = cleanEnv({ DATABASE_URL: database.url })
    const created = await runKeysCli(['create', '--plan', 'free', '--name', 'unwritten', '--json'], env, 20_000, 'disk-full')
    expect(created.code, created.stderr).toBe(1)
    expect(created.stderr).toMatch(/^error: stdout could not be written \(ENOSPC\); create was done, but the new key is lost with it: revoke it[^\n]*\n$/)
    expect(created.stderr).not.toMatch(ANY_KEY)
    const listed = await runKeysCli(['list'], env, 20_000, 'disk-full')
    expect(listed.code, listed.stderr).toBe(1)
    expect(listed.stderr).toBe('error: stdout could not be written (ENOSPC); nothing was changed\n')
  })

  it('tells a key expired or active by the database\'s clock, not by a CLI machine whose clock is 10 min off', async () => {
    await schema()
    const live = await repository.create({ name: 'five minutes left', plan: 'free', expiresInMillis: 300_000 })
    const gone = await repository.create({ name: 'expired', plan: 'free', expiresInMillis: -1_000 })
    // A process of its own: the skewed clock is loaded through NODE_OPTIONS.
    const skewed = (millis: number, id: string) =>
      runKeysCli(['show', id, '--json'], cleanEnv({ DATABASE_URL: database.url, SKEWED_CLOCK_MILLIS: String(millis), NODE_OPTIONS: `--import ${pathToFileURL(path.resolve('test/helpers/skewedClock.mjs')).href}` }))
    const [fast, slow] = await Promise.all([skewed(600_000, live.record.id), skewed(-600_000, gone.record.id)])
    expect(fast.code, fast.stderr).toBe(0)
    expect(JSON.parse(fast.stdout)).toMatchObject({ id: live.record.id, state: 'active' })
    expect(slow.code, slow.stderr).toBe(0)
    expect(JSON.parse(slow.stdout)).toMatchObject({ id: gone.record.id, state: 'expired' })

    // An expiry five minutes ahead of a clock ten minutes behind has passed for the gateways: no key.
    const before = await repository.count()
    const passed = new Date(Date.now() - 300_000).toISOString()
    const created = await runKeysCli(
      ['create', '--plan', 'free', '--name', 'born-expired', '--expires', passed],
      cleanEnv({ DATABASE_URL: database.url, SKEWED_CLOCK_MILLIS: '-600000', NODE_OPTIONS: `--import ${pathToFileURL(path.resolve('test/helpers/skewedClock.mjs')).href}` }),
    )
    expectFailure(created, new RegExp(`^error: --expires ${passed.replace(/[.]/g, '\\.')} is not in the future by the database's clock \\(.+ there\\): no key was created\\n$`))
    expect(await repository.count()).toBe(before)
  })

  it('shows, revokes, moves and re-limits a key; an unknown id exits 1', async () => {
    await schema()
    const kept = (await repository.create({ name: 'kept', plan: 'pro' })).record
    const gone = (await repository.create({ name: 'gone', plan: 'pro' })).record
    const plain = (await repository.create({ name: 'plain', plan: 'pro' })).record

    const [show, revoke, toBusiness, toEnterprise, unknown] = await Promise.all([
      run('show', kept.id),
      run('revoke', gone.id, '--json'),
      run('set-plan', kept.id, 'business', '--json'),
      run('set-plan', plain.id, 'enterprise'),
      run('revoke', 'key_doesNotExist', '--json'),
    ])
    expect(show.code, show.stderr).toBe(0)
    expect(show.stdout).toContain(kept.id)
    expect(show.stdout).toContain(`${kept.displayPrefix}…`)
    expect(show.stdout).toMatch(/name\s+kept/)

    expect(revoke.code, revoke.stderr).toBe(0)
    expect(JSON.parse(revoke.stdout)).toMatchObject({ id: gone.id, state: 'revoked' })
    expect((await repository.findById(gone.id))?.revokedAt).toBeInstanceOf(Date)

    expect(toBusiness.code, toBusiness.stderr).toBe(0)
    expect(JSON.parse(toBusiness.stdout)).toMatchObject({ id: kept.id, plan: 'business', perMinute: 1000, perDay: 100000 })
    expect((await repository.findById(kept.id))?.plan).toBe('business')

    // A key without custom limits cannot move to the plan whose limits are "custom".
    expectUsageError(toEnterprise, /plan "enterprise" has custom limits/)
    expect((await repository.findById(plain.id))?.plan).toBe('pro')

    expectFailure(unknown, /^error: no API key with id "key_doesNotExist" \(`npm run keys -- list` shows the ids\)\n$/)

    const limited = await run('set-limits', kept.id, '--per-minute', '10', '--per-day', '100', '--json')
    expect(limited.code, limited.stderr).toBe(0)
    expect(JSON.parse(limited.stdout)).toMatchObject({ perMinute: 10, perDay: 100, customLimits: true })
    expect(await repository.findById(kept.id)).toMatchObject({ plan: 'business', perMinute: 10, perDay: 100 })

    const cleared = await run('set-limits', kept.id, '--clear')
    expect(cleared.code, cleared.stderr).toBe(0)
    expect(cleared.stdout).toMatch(/limits\s+1,000\/min, 100,000\/day/)
    expect(await repository.findById(kept.id)).toMatchObject({ perMinute: null, perDay: null })
  })

  // Moves to and from the plan whose limits are "custom" (enterprise): a key there always has
  // limits of its own, or every gateway gives it the strictest plan's (60/min, 1,000/day).
  it('moves a key onto the custom plan with the limits given, or those it has; never clears an enterprise key\'s limits', async () => {
    await schema()
    const given = (await repository.create({ name: 'given', plan: 'pro' })).record
    const own = (await repository.create({ name: 'own', plan: 'pro', perMinute: 700, perDay: 7000 })).record
    const enterprise = (await repository.create({ name: 'big', plan: 'enterprise', perMinute: 5000, perDay: 500000 })).record
    const withKept = (await repository.create({ name: 'kept limits', plan: 'pro', perMinute: 50, perDay: 500 })).record

    const [toEnterprise, ownToEnterprise, clear, toBusiness] = await Promise.all([
      run('set-plan', given.id, 'enterprise', '--per-minute', '5000', '--per-day', '2000000', '--json'),
      run('set-plan', own.id, 'enterprise', '--json'),
      run('set-limits', enterprise.id, '--clear'),
      run('set-plan', withKept.id, 'business'),
    ])
    expect(toEnterprise.code, toEnterprise.stderr).toBe(0)
    expect(JSON.parse(toEnterprise.stdout)).toMatchObject({ plan: 'enterprise', perMinute: 5000, perDay: 2000000, customLimits: true })
    expect(await repository.findById(given.id)).toMatchObject({ plan: 'enterprise', perMinute: 5000, perDay: 2000000 })

    expect(ownToEnterprise.code, ownToEnterprise.stderr).toBe(0)
    expect(await repository.findById(own.id)).toMatchObject({ plan: 'enterprise', perMinute: 700, perDay: 7000 })

    expectUsageError(clear, /plan "enterprise" has no limits of its own \("custom"\), so the key's limits cannot be cleared/)
    expect(await repository.findById(enterprise.id)).toMatchObject({ perMinute: 5000, perDay: 500000 })

    // Moved to a plan with limits of its own, a key keeps its custom ones, and is told so.
    expect(toBusiness.code, toBusiness.stderr).toBe(0)
    expect(toBusiness.stdout).toMatch(/Note: the key keeps its custom limits, which take the place of plan business's/)
    expect(await repository.findById(withKept.id)).toMatchObject({ plan: 'business', perMinute: 50, perDay: 500 })
  })

  it('unbans a key through the change log, and says it is pending while no gateway has applied it; an unknown id exits 1', async () => {
    await schema()
    const { record } = await repository.create({ name: 'banned', plan: 'free' })
    const [done, json, unknown] = await Promise.all([run('unban', record.id), run('unban', record.id, '--json'), run('unban', 'key_doesNotExist')])
    expect(done.code, done.stderr).toBe(0)
    expect(done.stdout).toMatch(
      new RegExp(`^Unban of API key ${record.id} requested, not applied yet: no gateway lifted the ban within 3 s \\(none is running`),
    )
    expect(JSON.parse(json.stdout)).toMatchObject({ id: record.id, unban: 'pending' })
    const changes = await repository.changesSince(0)
    expect(changes.filter((change) => change.keyId === record.id).map((change) => change.kind)).toContain('unban')
    expectFailure(unknown, /no API key with id "key_doesNotExist"/)
  })

  it('shows a key\'s ban in force in show and list, not one that has ended, until an unban is applied', async () => {
    await schema()
    const [{ record: banned }, { record: lapsed }] = await Promise.all([
      repository.create({ name: 'hammering', plan: 'free' }),
      repository.create({ name: 'calmed down', plan: 'free' }),
    ])
    const now = Date.now()
    await repository.recordBan({ keyId: banned.id, step: 2, startedAt: new Date(now - 60_000), endsAt: new Date(now + 840_000) })
    await repository.recordBan({ keyId: lapsed.id, step: 0, startedAt: new Date(now - 120_000), endsAt: new Date(now - 60_000) })
    const endsAt = new Date(now + 840_000).toISOString()

    const [text, json, list, listJson, other] = await Promise.all([
      run('show', banned.id),
      run('show', banned.id, '--json'),
      run('list'),
      run('list', '--json'),
      run('show', lapsed.id, '--json'),
    ])
    expect(text.code, text.stderr).toBe(0)
    expect(text.stdout).toContain(`  ban      until ${endsAt.slice(0, 19).replace('T', ' ')} UTC (ladder step 2, since `)
    // Its state says so as list's STATE does: "active" read as a key in good standing.
    expect(text.stdout).toContain(`  state    banned until ${endsAt.slice(0, 19).replace('T', ' ')} UTC\n`)
    expect(JSON.parse(json.stdout)).toMatchObject({ id: banned.id, state: 'active', ban: { step: 2, endsAt } })
    const row = (id: string) => list.stdout.split('\n').find((line) => line.startsWith(id)) ?? ''
    expect(row(banned.id)).toContain(`banned until ${endsAt.slice(0, 10)} ${endsAt.slice(11, 19)} UTC`)
    expect(row(lapsed.id)).toMatch(/\bactive\b/)
    const listed = (JSON.parse(listJson.stdout) as { keys: { id: string; ban: unknown }[] }).keys
    expect(listed.find((key) => key.id === banned.id)?.ban).toMatchObject({ step: 2 })
    expect(listed.find((key) => key.id === lapsed.id)?.ban).toBeNull()
    expect(JSON.parse(other.stdout)).toMatchObject({ ban: null })

    // No gateway is running: the unban is pending, and the ban it has not lifted yet is still shown.
    const unbanned = await run('unban', banned.id)
    expect(unbanned.code, unbanned.stderr).toBe(0)
    expect(unbanned.stdout).toMatch(/\n {2}ban {6}until /)
    // A gateway applying it deletes the record with its mark.
    const change = (await repository.changesSince(0)).filter((entry) => entry.keyId === banned.id && entry.kind === 'unban').at(-1)
    await repository.markUnbanApplied(change?.id ?? 0)
    expect(await repository.activeBans([banned.id])).toEqual(new Map())
    expect((await run('show', banned.id)).stdout).toMatch(/\n {2}ban {6}none\n/)
  })

  it("orders a ban and an unban on Postgres's clock, whatever the rate-limit store's clock says of the ban", async () => {
    await schema()
    const [{ record: ahead }, { record: behind }] = await Promise.all([
      repository.create({ name: 'store clock ahead', plan: 'free' }),
      repository.create({ name: 'store clock behind', plan: 'free' }),
    ])
    // Banned by a gateway whose Redis runs 90 s ahead, then unbanned: the unban came later, so it
    // stays pending until a gateway applies it, and then it clears the ban's record.
    const aheadMillis = Date.now() + 90_000
    await repository.recordBan({ keyId: ahead.id, step: 0, startedAt: new Date(aheadMillis), endsAt: new Date(aheadMillis + 600_000) })
    const unban = await repository.requestUnban(ahead.id)
    await repository.pendingUnbans()
    expect(await repository.isUnbanApplied(unban!)).toBe(false)
    await repository.markUnbanApplied(unban!)
    expect(await repository.activeBans([ahead.id])).toEqual(new Map())

    // Unbanned, then banned again through a Redis 90 s behind: the ban came later, so the unban is
    // overtaken (closed without lifting it) and the ban's record stays.
    const overtaken = await repository.requestUnban(behind.id)
    const behindMillis = Date.now() - 90_000
    await repository.recordBan({ keyId: behind.id, step: 1, startedAt: new Date(behindMillis), endsAt: new Date(behindMillis + 600_000) })
    await repository.pendingUnbans()
    expect(await repository.isUnbanApplied(overtaken!)).toBe(true)
    expect((await repository.activeBans([behind.id])).get(behind.id)).toMatchObject({ step: 1 })
  })

  it('orders a ban before an unban asked for while its record was still being written', async () => {
    await schema()
    const { record } = await repository.create({ name: 'late record', plan: 'free' })
    const startedHere = performance.now()
    const startedAt = new Date()
    await new Promise((resolve) => setTimeout(resolve, 50))
    const unban = await repository.requestUnban(record.id)
    await new Promise((resolve) => setTimeout(resolve, 50))
    // The gateway's write of the ban's record lands only now (it waited for a connection, say).
    await repository.recordBan({ keyId: record.id, step: 0, startedAt, endsAt: new Date(startedAt.getTime() + 600_000) }, startedHere)
    await repository.pendingUnbans()
    expect(await repository.isUnbanApplied(unban!)).toBe(false)
  })

  it('orders a ban that a gateway of the previous version writes over an earlier record after the unban it overtook', async () => {
    await schema()
    const { record } = await repository.create({ name: 'rolling deploy', plan: 'free' })
    const first = new Date(Date.now() - 3_600_000)
    await repository.recordBan({ keyId: record.id, step: 0, startedAt: first, endsAt: new Date(first.getTime() + 60_000) }, performance.now() - 3_600_000)
    const unban = await repository.requestUnban(record.id)
    await new Promise((resolve) => setTimeout(resolve, 50))
    // The next ban, recorded by the previous version's statement, which knows no recorded_at.
    const startedAt = new Date()
    await pool.query(
      `INSERT INTO gateway.api_key_bans (key_id, step, started_at, ends_at) VALUES ($1, $2, $3, $4)
       ON CONFLICT (key_id) DO UPDATE SET step = EXCLUDED.step, started_at = EXCLUDED.started_at, ends_at = EXCLUDED.ends_at`,
      [record.id, 1, startedAt, new Date(startedAt.getTime() + 600_000)],
    )
    await repository.pendingUnbans()
    expect(await repository.isUnbanApplied(unban!)).toBe(true)
    expect((await repository.activeBans([record.id])).get(record.id)).toMatchObject({ step: 1 })
  })

  it('refuses to change or unban a revoked or expired key with exit 1, and changes nothing', async () => {
    await schema()
    const { record } = await repository.create({ name: 'revoked', plan: 'pro' })
    await repository.revoke(record.id)
    const changesBefore = (await repository.changesSince(0)).filter((change) => change.keyId === record.id).length
    const runs = await Promise.all([
      run('set-plan', record.id, 'business'),
      run('set-limits', record.id, '--per-minute', '10', '--per-day', '100', '--json'),
      run('set-limits', record.id, '--clear'),
      run('unban', record.id),
    ])
    for (const refused of runs) {
      expect(refused.code, refused.stderr).toBe(1)
      expect(refused.stdout).toBe('')
      expect(refused.stderr).toMatch(new RegExp(`^error: API key ${record.id} is revoked \\(since .+ UTC\\): a revoked key cannot be changed or unbanned`))
      expect(refused.stderr).not.toMatch(/\n\s+at /)
    }
    expect(await repository.findById(record.id)).toMatchObject({ plan: 'pro', perMinute: null, perDay: null })
    expect((await repository.changesSince(0)).filter((change) => change.keyId === record.id)).toHaveLength(changesBefore)

    // An expired key, by the database's clock, likewise: no gateway will take it again.
    const expired = (await repository.create({ name: 'expired', plan: 'pro', expiresInMillis: -1_000 })).record
    for (const refused of await Promise.all([run('set-plan', expired.id, 'business'), run('unban', expired.id)])) {
      expect(refused.code, refused.stderr).toBe(1)
      expect(refused.stderr).toMatch(new RegExp(`^error: API key ${expired.id} expired .+ UTC: an expired key cannot be changed or unbanned`))
    }
    expect(await repository.findById(expired.id)).toMatchObject({ plan: 'pro' })

    // Revoking it again says so and keeps the time it was first revoked.
    const revokedAt = (await repository.findById(record.id))?.revokedAt
    const again = await run('revoke', record.id)
    expect(again.code, again.stderr).toBe(0)
    expect(again.stdout).toMatch(new RegExp(`^API key ${record.id} was already revoked\\.`))
    expect((await repository.findById(record.id))?.revokedAt).toEqual(revokedAt)
  })

  // The guards were checks before the change: a set-plan whose key was revoked in between moved
  // the revoked key (exit 0), and one racing `set-limits --clear` left an enterprise key without
  // limits. A revoke holding the row while set-plan and set-limits wait on it makes the race sure.
  it('refuses a change whose key a revoke committed after the change had read it, and says a revoke kept waiting on a lock was not done', async () => {
    await schema()
    const { record } = await repository.create({ name: 'revoked-meanwhile', plan: 'pro' })
    const operator = new pg.Client({ connectionString: database.url })
    await operator.connect()
    try {
      await operator.query('BEGIN')
      await operator.query('UPDATE gateway.api_keys SET revoked_at = now() WHERE id = $1', [record.id])
      const waiting = Promise.all([
        run('set-plan', record.id, 'enterprise', '--per-minute', '10', '--per-day', '100'),
        run('set-limits', record.id, '--clear', '--json'),
      ])
      // Both have read the key (not revoked yet, to them) and wait for the row (seen from another
      // session: within a transaction pg_stat_activity keeps its first snapshot).
      await eventually(async () => {
        const { rows } = await pool.query<{ count: number }>(
          `SELECT count(*)::int AS count FROM pg_stat_activity WHERE application_name = 'keys-cli' AND wait_event_type = 'Lock'`,
        )
        return rows[0]!.count === 2
      }, 20_000)
      await operator.query('COMMIT')
      for (const refused of await waiting) {
        expect(refused.code, refused.stderr).toBe(1)
        expect(refused.stdout).toBe('')
        expect(refused.stderr).toMatch(new RegExp(`^error: API key ${record.id} is revoked \\(since .+ UTC\\): a revoked key cannot be changed`))
      }
      expect(await repository.findById(record.id)).toMatchObject({ plan: 'pro', perMinute: null, perDay: null })

      // A revoke held on the row past the CLI's statement timeout: not done, and it says so.
      const held = (await repository.create({ name: 'held', plan: 'pro' })).record
      await operator.query('BEGIN')
      await operator.query('UPDATE gateway.api_keys SET name = name WHERE id = $1', [held.id])
      const revoke = await run('revoke', held.id)
      await operator.query('ROLLBACK')
      expectFailure(revoke, /^error: revoke was not done: Postgres did not finish its statement within 5 s at DATABASE_URL \(.+\), as when another transaction holds the key's row or its table; nothing was changed, run it again\n$/)
      expect((await repository.findById(held.id))?.revokedAt).toBeNull()

      // Done, then its result not read back within the bound (the ban records locked): it says so,
      // not that nothing was changed.
      await operator.query('BEGIN')
      await operator.query('LOCK TABLE gateway.api_key_bans')
      const revokedSlowly = await run('revoke', held.id)
      await operator.query('ROLLBACK')
      expectFailure(revokedSlowly, /^error: revoke was done, but reading its result back took over 5 s at DATABASE_URL \(.+\); `npm run keys -- show <id>` shows the key as it is now\n$/)
      expect((await repository.findById(held.id))?.revokedAt).not.toBeNull()
    } finally {
      await operator.end()
    }
  })

  it('never echoes an API key given where an id is expected, and says ids are expected', async () => {
    await schema()
    const { key } = await repository.create({ name: 'secret', plan: 'free' })
    const runs = await Promise.all([
      run('show', key),
      run('revoke', key, '--json'),
      run('set-plan', key, 'pro'),
      run('show', key, 'extra'),
      run(key),
      run('create', '--plan', key, '--name', 'x'),
      run('create', '--plan', 'free', `--name=${key}`),
      // Glued to a word, or cut short: still a key's characters.
      run('show', `x${key}`),
      run('show', key.slice(0, 23)),
    ])
    for (const refused of runs) {
      expectUsageError(refused, /an argument looks like an API key \(aas_…\), which is not repeated here: the commands take key ids \(key_…\)/)
      expect(refused.stderr).not.toContain(key)
      expect(refused.stderr).not.toContain(key.slice(4, 20))
    }
    expect((await repository.findByHash(hashApiKey(key)))?.revokedAt).toBeNull()
  })

  // The guard against a pasted key must not take a name that merely holds the four letters for one.
  it('creates a key named saas_billing or paas_team-2: a name that contains "aas_" is no API key', async () => {
    const names = ['saas_billing', 'paas_team-2']
    const runs = await Promise.all(names.map((name) => run('create', '--plan', 'free', '--name', name, '--json')))
    for (const [index, made] of runs.entries()) {
      expect(made.code, made.stderr).toBe(0)
      expect((JSON.parse(made.stdout) as { name: string }).name).toBe(names[index])
    }
  })

  it('shows the limits a key on a plan the config lacks really gets (the strictest), and why', async () => {
    await schema()
    // Written by hand, as the CLI refuses plans the config does not define.
    const { record } = await repository.create({ name: 'stray', plan: 'gold' })
    const [text, json] = await Promise.all([run('show', record.id), run('show', record.id, '--json')])
    expect(text.code, text.stderr).toBe(0)
    expect(text.stdout).toMatch(/limits\s+60\/min, 1,000\/day \(strictest: plan gold is not in the gateway config\)/)
    expect(JSON.parse(json.stdout)).toMatchObject({ plan: 'gold', perMinute: 60, perDay: 1000 })
  })

  // The headline said the key "now has the limits of plan gold" above a line giving it the strictest.
  it('says a key whose limits are cleared gets the strictest limits when its plan is not in the config, not its plan\'s', async () => {
    await schema()
    const { record } = await repository.create({ name: 'stray limited', plan: 'gold', perMinute: 500, perDay: 5000 })
    const cleared = await run('set-limits', record.id, '--clear')
    expect(cleared.code, cleared.stderr).toBe(0)
    const [headline] = cleared.stdout.split('\n')
    expect(headline).toBe(`API key ${record.id} now gets the strictest limits: its plan gold is not in the gateway config.`)
    expect(cleared.stdout).toMatch(/limits\s+60\/min, 1,000\/day \(strictest: plan gold is not in the gateway config\)/)
    expect(await repository.findById(record.id)).toMatchObject({ perMinute: null, perDay: null })
    const onItsPlan = await repository.create({ name: 'plan limited', plan: 'pro', perMinute: 500, perDay: 5000 })
    expect((await run('set-limits', onItsPlan.record.id, '--clear')).stdout.split('\n')[0]).toBe(`API key ${onItsPlan.record.id} now has the limits of plan pro.`)
  })

  it('without DATABASE_URL, uses the embedded database of a running npm start, or says what to do', async () => {
    await schema()
    const { record } = await repository.create({ name: 'found', plan: 'free' })
    const dataDir = await mkdtemp(path.join(tmpdir(), 'keys-cli-'))
    const emptyDir = await mkdtemp(path.join(tmpdir(), 'keys-cli-empty-'))
    const reusedDir = await mkdtemp(path.join(tmpdir(), 'keys-cli-reused-'))
    try {
      // This test process stands in for `npm start`: the pid must belong to a live process.
      await writeFile(path.join(dataDir, 'embedded-postgres.json'), JSON.stringify({ url: database.url, pid: process.pid }))
      // The pid is alive, but it is not the process that wrote the file (a pid given again after
      // a reboot or a crash): that npm start is gone, and the CLI says so rather than trying its URL.
      const started = processIdentity(process.pid)
      if (started !== undefined) {
        await writeFile(path.join(reusedDir, 'embedded-postgres.json'), JSON.stringify({ url: database.url, pid: process.pid, started: `${started}0` }))
      }
      const [found, missing, notAUrl, reused] = await Promise.all([
        keys(['list', '--json'], cleanEnv({ DATA_DIR: dataDir })),
        keys(['list', '--json'], cleanEnv({ DATA_DIR: emptyDir })),
        // A DATABASE_URL that is no Postgres URL at all is refused as the services refuse it.
        keys(['list', '--json'], cleanEnv({ DATABASE_URL: 'nonsense' })),
        started === undefined ? undefined : keys(['list', '--json'], cleanEnv({ DATA_DIR: reusedDir })),
      ])
      expect(found.code, found.stderr).toBe(0)
      const { keys: listed } = JSON.parse(found.stdout) as { keys: { id: string }[] }
      expect(listed.map((entry) => entry.id)).toContain(record.id)

      expect(missing.code).toBe(1)
      expect(missing.stdout).toBe('')
      expect(missing.stderr).toMatch(/DATABASE_URL/)
      expect(missing.stderr).toMatch(/npm start/)
      expect(missing.stderr).not.toMatch(/\n\s+at /)

      expect(notAUrl.code).toBe(1)
      expect(notAUrl.stderr).toContain('DATABASE_URL must be a postgres:// URL')

      if (reused !== undefined) {
        expect(reused.code).toBe(1)
        expect(reused.stderr).toMatch(/was left by an `npm start` \(pid \d+\) that is no longer running/)
      }
    } finally {
      await rm(dataDir, { recursive: true, force: true })
      await rm(emptyDir, { recursive: true, force: true })
      await rm(reusedDir, { recursive: true, force: true })
    }
  })
})

// Its own database: 130,000 rows in the shared one would have to be deleted again (each delete
// writing the change log) before the other tests read the log and the key list.
describe('keys CLI (npm run keys) on a large table', () => {
  const database = suiteDatabase()

  beforeAll(async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'cli-test', max: 1 })
    await migrate(pool, GATEWAY_MIGRATIONS).finally(() => pool.end())
    // Not through the pool: one statement for all 130,000 rows may outlive its statement timeout.
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    try {
      // The change log's triggers are off for this seeding only: list reads the keys, not the log,
      // and writing 130,000 log entries took most of the test's time.
      await client.query('SET session_replication_role = replica')
      await client.query(
        `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan, created_at)
         SELECT 'key_many' || lpad(g::text, 6, '0'), sha256(('many' || g)::bytea), 'aas_many00', 'customer ' || g, 'free',
                now() - interval '1 day' + g * interval '1 millisecond'
           FROM generate_series(1, 130000) g`,
      )
    } finally {
      await client.end()
    }
  })

  it('lists 130,000 keys in full, in creation order, as a table and as one JSON object', async () => {
    const env = cleanEnv({ DATABASE_URL: database.url })
    const [text, json] = await Promise.all([runKeysCli(['list'], env), runKeysCli(['list', '--json'], env)])
    expect(text.code, text.stderr).toBe(0)
    const lines = text.stdout.trimEnd().split('\n').filter((line) => line.startsWith('key_'))
    expect(lines).toHaveLength(130_000)
    expect(lines[0]).toMatch(/^key_many000001\s/)
    expect(lines.at(-1)).toMatch(/^key_many130000\s/)
    expect(json.code, json.stderr).toBe(0)
    const listed = (JSON.parse(json.stdout) as { keys: { id: string }[] }).keys
    expect(listed).toHaveLength(130_000)
    expect([listed[0]!.id, listed[4_999]!.id, listed[5_000]!.id, listed.at(-1)!.id]).toEqual(['key_many000001', 'key_many005000', 'key_many005001', 'key_many130000'])
  }, 60_000)
})
