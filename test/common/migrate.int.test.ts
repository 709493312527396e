import { createHash } from 'node:crypto'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import pino from 'pino'
import { describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { captureLog } from '../helpers/logCapture.ts'
import { cuttableRelay, relayTo } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { eventually } from '../gateway/rateLimit/httpLimits.ts'

describe('migrations at boot', () => {
  const database = suiteDatabase()

  it('warn, naming them, of recorded migrations with no file here or under another file\'s name', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-strangers-test' })
    const log = captureLog()
    const logger = pino(log.stream)
    try {
      await migrate(pool, PETS_MIGRATIONS, logger)
      expect(log.entries().filter((entry) => entry.level === 40)).toEqual([])
      await pool.query(`UPDATE pets.schema_migrations SET name = '001_renamed.sql' WHERE version = 1`)
      await pool.query(`INSERT INTO pets.schema_migrations (version, name) VALUES (99, '099_from_a_newer_version.sql')`)
      expect(await migrate(pool, PETS_MIGRATIONS, logger)).toEqual([])
      const warnings = log.entries().filter((entry) => entry.level === 40)
      expect(warnings).toHaveLength(1)
      expect(warnings[0]).toMatchObject({
        schema: 'pets',
        recorded: [
          { version: 1, name: '001_renamed.sql', file: '001_pets.sql' },
          { version: 99, name: '099_from_a_newer_version.sql', file: null },
        ],
      })
    } finally {
      await pool.query('DROP SCHEMA pets CASCADE').catch(() => undefined)
      await pool.end()
    }
  })

  it('fail with an error, not a crash, when the connection is lost while waiting for the lock', async () => {
    // Another instance holds the schema's migration lock, so this one waits on it.
    const holder = new pg.Client({ connectionString: database.url })
    await holder.connect()
    const lock = createHash('sha256').update(`migrations:${PETS_MIGRATIONS.schema}`).digest().readBigInt64BE(0)
    await holder.query('SELECT pg_advisory_lock($1::bigint)', [lock.toString()])

    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const viaRelay = new URL(database.url)
    viaRelay.port = String(relay.port)
    const pool = createPool({ connectionString: viaRelay.toString(), applicationName: 'migrate-test' })
    pool.on('error', () => undefined)
    try {
      const migrating = migrate(pool, PETS_MIGRATIONS)
      const outcome = migrating.then(
        () => 'migrated',
        (error: unknown) => (error instanceof Error ? error.message : String(error)),
      )
      await new Promise((resolve) => setTimeout(resolve, 500))
      await relay.cut()
      expect(await outcome).not.toBe('migrated')
      // Nothing was applied, and the next attempt, with the path back, applies everything.
      await holder.query('SELECT pg_advisory_unlock($1::bigint)', [lock.toString()])
      await relay.restore()
      expect(await migrate(pool, PETS_MIGRATIONS)).not.toHaveLength(0)
    } finally {
      await holder.end()
      await pool.end()
      await relay.close()
    }
  })

  /** Holds a schema's migration lock as another instance migrating would. */
  async function anotherInstanceMigrating(schema: string) {
    const holder = new pg.Client({ connectionString: database.url })
    await holder.connect()
    const lock = createHash('sha256').update(`migrations:${schema}`).digest().readBigInt64BE(0).toString()
    await holder.query('SELECT pg_advisory_lock($1::bigint)', [lock])
    return {
      /** Whether a session of `applicationName` waits for a lock (this one). */
      waitedForBy: async (applicationName: string) => {
        const { rows } = await holder.query<{ waiting: number }>(
          `SELECT count(*)::int AS waiting FROM pg_stat_activity
            WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`,
          [applicationName],
        )
        return rows[0]!.waiting > 0
      },
      release: () => holder.query('SELECT pg_advisory_unlock($1::bigint)', [lock]),
      end: () => holder.end(),
    }
  }

  /** A pool to the suite database through a relay the test can silence. */
  async function poolThroughRelay(applicationName: string) {
    const { relay, url: viaRelay } = await relayTo(database.url)
    const pool = createPool({ connectionString: viaRelay, applicationName })
    pool.on('error', () => undefined)
    return { relay, pool, port: Number(new URL(viaRelay).port) }
  }

  /** The migration's outcome: 'migrated', its error's message, or 'still waiting' after `millis`. */
  const outcomeWithin = (migrating: Promise<unknown>, millis: number) =>
    Promise.race([
      migrating.then(
        () => 'migrated',
        (error: unknown) => (error instanceof Error ? error.message : String(error)),
      ),
      new Promise<string>((resolve) => setTimeout(() => resolve(`still waiting after ${millis} ms`), millis).unref()),
    ])

  /** The migration fails with `message` within 20 s of now (waited for up to 40 s). */
  async function expectFailsWithin20s(migrating: Promise<unknown>, message: RegExp) {
    const started = performance.now()
    expect(await outcomeWithin(migrating, 40_000)).toMatch(message)
    expect(performance.now() - started).toBeLessThan(20_000)
  }

  // The tests from here on wait on Postgres or on timers, not on the CPU, and share nothing: each
  // has its own lock or schema and its own connections (the pets lock is one test's only). They
  // run together.
  // The request pool bounds statements at 5 s; a second replica waits for the first's migrations
  // as long as they take (here 6.5 s), then finds nothing left to apply.
  it.concurrent('wait for another instance migrating for longer than a request may take', async () => {
    const holder = new pg.Client({ connectionString: database.url })
    await holder.connect()
    const lock = createHash('sha256').update(`migrations:${GATEWAY_MIGRATIONS.schema}`).digest().readBigInt64BE(0)
    await holder.query('SELECT pg_advisory_lock($1::bigint)', [lock.toString()])
    let released = false
    setTimeout(() => {
      released = true
      void holder.query('SELECT pg_advisory_unlock($1::bigint)', [lock.toString()])
    }, 6_500)
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-wait-test' })
    try {
      expect(await migrate(pool, GATEWAY_MIGRATIONS)).not.toHaveLength(0)
      // It waited for the other instance: nothing was applied before its lock was let go.
      expect(released).toBe(true)
    } finally {
      await holder.end()
      await pool.end()
    }
  }, 20_000)

  // A failover to a host that is gone: the connection stays open, and nothing comes back on it or
  // on a new one. The service must fail its start (and be restarted), not hang.
  it.concurrent('fail within 20 s, saying Postgres stopped answering, when the connection goes mute while waiting for another instance', async () => {
    const other = await anotherInstanceMigrating(PETS_MIGRATIONS.schema)
    const { relay, pool } = await poolThroughRelay('migrate-mute-test')
    try {
      const migrating = migrate(pool, PETS_MIGRATIONS)
      migrating.catch(() => undefined)
      await eventually(() => other.waitedForBy('migrate-mute-test'), 10_000)
      await relay.silence()
      await expectFailsWithin20s(migrating, /^Postgres stopped answering on the migration connection/)
    } finally {
      await relay.close()
      await other.end()
      await pool.end()
    }
  }, 60_000)

  // README (Upgrades): a failed migration is rolled back and stops the service, leaving the
  // database as it was before that migration; the error names it.
  it.concurrent('fail naming the migration that failed, leaving what it did undone and unrecorded, and the ones before it applied', async () => {
    const directory = await mkdtemp(path.join(os.tmpdir(), 'failing_migration-'))
    await writeFile(path.join(directory, '001_first.sql'), 'CREATE TABLE failing_migration.first (id int);')
    await writeFile(path.join(directory, '002_broken.sql'), 'CREATE TABLE failing_migration.second (id int); SELECT 1 / 0;')
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-failing-test' })
    try {
      const failure = await migrate(pool, { schema: 'failing_migration', directory }).then(
        () => undefined,
        (error: unknown) => error as Error,
      )
      expect(failure?.message).toBe('migration 002_broken.sql failed')
      expect((failure?.cause as Error | undefined)?.message).toBe('division by zero')
      const { rows: recorded } = await pool.query<{ version: number }>('SELECT version FROM failing_migration.schema_migrations ORDER BY version')
      expect(recorded.map((row) => row.version)).toEqual([1])
      const { rows: tables } = await pool.query<{ name: string }>(
        `SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'failing_migration' ORDER BY table_name`,
      )
      expect(tables.map((table) => table.name)).toEqual(['first', 'schema_migrations'])
    } finally {
      await pool.query('DROP SCHEMA failing_migration CASCADE').catch(() => undefined)
      await pool.end()
      await rm(directory, { recursive: true, force: true })
    }
  }, 30_000)

  it.concurrent('apply in numeric order past 999, and refuse, applying nothing, a .sql file misnamed or a version two files share', async () => {
    const directory = await mkdtemp(path.join(os.tmpdir(), 'ordered_migration-'))
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-order-test' })
    const set = { schema: 'ordered_migration', directory }
    try {
      // As text, 1000 sorted before 999 and ran on a table not made yet.
      await writeFile(path.join(directory, '999_make.sql'), 'CREATE TABLE ordered_migration.pets (id int);')
      await writeFile(path.join(directory, '1000_fill.sql'), 'INSERT INTO ordered_migration.pets VALUES (1);')
      await writeFile(path.join(directory, 'README.md'), 'not a migration')
      expect(await migrate(pool, set)).toEqual([999, 1000])

      await writeFile(path.join(directory, '1001-add-column.sql'), 'ALTER TABLE ordered_migration.pets ADD COLUMN name text;')
      await expect(migrate(pool, set)).rejects.toThrow(`${directory}: 1001-add-column.sql not named NNN_description.sql`)
      await rm(path.join(directory, '1001-add-column.sql'))

      await writeFile(path.join(directory, '1001_add_name.sql'), 'ALTER TABLE ordered_migration.pets ADD COLUMN name text;')
      await writeFile(path.join(directory, '1001_add_age.sql'), 'ALTER TABLE ordered_migration.pets ADD COLUMN age int;')
      await expect(migrate(pool, set)).rejects.toThrow(`${directory}: 1001_add_age.sql and 1001_add_name.sql share a version number`)

      const { rows: recorded } = await pool.query<{ version: number }>('SELECT version FROM ordered_migration.schema_migrations ORDER BY version')
      expect(recorded.map((row) => row.version)).toEqual([999, 1000])
      const { rows: columns } = await pool.query<{ name: string }>(
        `SELECT column_name AS name FROM information_schema.columns WHERE table_schema = 'ordered_migration' AND table_name = 'pets'`,
      )
      expect(columns.map((column) => column.name)).toEqual(['id'])
    } finally {
      await pool.query('DROP SCHEMA ordered_migration CASCADE').catch(() => undefined)
      await pool.end()
      await rm(directory, { recursive: true, force: true })
    }
  }, 30_000)

  // Neither an index build nor the wait for another instance's lock has a deadline: the watch for
  // a mute connection sees the server at work and leaves it be.
  it.concurrent('run a migration for as long as it takes (here 8 s, longer than the watch waits before looking)', async () => {
    const slow = await oneMigration('slow_migration', 'SELECT pg_sleep(8); CREATE TABLE slow_migration.done (id int);')
    const { relay, pool } = await poolThroughRelay('migrate-slow-test')
    try {
      expect(await migrate(pool, slow.set)).toEqual([1])
    } finally {
      await pool.query('DROP SCHEMA slow_migration CASCADE').catch(() => undefined)
      await pool.end()
      await relay.close()
      await slow.remove()
    }
  }, 30_000)

  // A NAT or relay that forgot the connection while the server runs on: the server answers, the
  // answer is lost, and the session waits for the client as the client waits for it.
  it.concurrent('fail within 20 s, saying Postgres stopped answering, when the connection goes mute while the server and new connections answer', async () => {
    const forgotten = await oneMigration('forgotten_wait', 'CREATE TABLE forgotten_wait.first (id int);')
    const other = await anotherInstanceMigrating(forgotten.set.schema)
    const { relay, pool } = await poolThroughRelay('migrate-forgotten-test')
    try {
      const migrating = migrate(pool, forgotten.set)
      migrating.catch(() => undefined)
      await eventually(() => other.waitedForBy('migrate-forgotten-test'), 10_000)
      await relay.silence()
      await relay.restore()
      await other.release()
      await expectFailsWithin20s(migrating, /^Postgres stopped answering on the migration connection \(the server has been idle in transaction/)
    } finally {
      await relay.close()
      await other.end()
      await pool.end()
      await forgotten.remove()
    }
  }, 60_000)

  // Between two migrations the session is the connection's own, on a direct connection: a BEGIN
  // lost on the way (a NAT that forgot the connection) leaves it idle while the client waits.
  it.concurrent('fail within 20 s, saying Postgres stopped answering, when the connection goes mute as the next migration begins', async () => {
    const first = await oneMigration('mute_begin', 'CREATE TABLE mute_begin.first (id int);')
    const { relay, pool, port } = await poolThroughRelay('migrate-mute-begin-test')
    const undo = onBegin(port, 2, () => {
      void relay.silence()
      void relay.restore()
    })
    try {
      await expectFailsWithin20s(migrate(pool, first.set), /^Postgres stopped answering on the migration connection \(the server has been idle/)
    } finally {
      undo()
      await pool.query('DROP SCHEMA mute_begin CASCADE').catch(() => undefined)
      await pool.end()
      await relay.close()
      await first.remove()
    }
  }, 60_000)

  // Nothing to look up yet at the first BEGIN: only whether Postgres takes a connection at all. A
  // connection idle in the pool since the start's checks answered that without a word to Postgres.
  it.concurrent('fail within 20 s, saying Postgres stopped answering, when Postgres goes silent as the first migration begins', async () => {
    const first = await oneMigration('silent_begin', 'CREATE TABLE silent_begin.first (id int);')
    const { relay, pool, port } = await poolThroughRelay('migrate-silent-begin-test')
    await pool.query('SELECT 1')
    const undo = onBegin(port, 1, () => void relay.silence())
    try {
      await expectFailsWithin20s(migrate(pool, first.set), /^Postgres stopped answering on the migration connection/)
    } finally {
      undo()
      await relay.close()
      await pool.end()
      await first.remove()
    }
  }, 60_000)
})

interface BeginWatch {
  port: number
  nth: number
  action: () => void
  begins: number
}

/** The watches in force, and pg's own query while any is: one patch for them all. */
const beginWatches = new Set<BeginWatch>()
let unpatchedQuery: typeof pg.Client.prototype.query | undefined

/**
 * Runs `action` as the `nth` BEGIN sent by a pg client to `port` is sent (the statement goes on
 * after it); returns what undoes this. By port, so the tests running alongside count for nothing.
 * One patch serves every watch: a patch each, undone in another order than made (tests running
 * together), put back a query without the watches of tests still running.
 */
function onBegin(port: number, nth: number, action: () => void): () => void {
  if (unpatchedQuery === undefined) {
    const query = (unpatchedQuery = pg.Client.prototype.query)
    pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
      if (args[0] === 'BEGIN') {
        for (const watch of beginWatches) if (this.port === watch.port && ++watch.begins === watch.nth) watch.action()
      }
      return (query as (...args: unknown[]) => unknown).apply(this, args)
    } as typeof query
  }
  const watch = { port, nth, action, begins: 0 }
  beginWatches.add(watch)
  return () => {
    beginWatches.delete(watch)
    if (beginWatches.size === 0 && unpatchedQuery !== undefined) {
      pg.Client.prototype.query = unpatchedQuery
      unpatchedQuery = undefined
    }
  }
}

/** A migration set of one file, `001_<schema>.sql` holding `sql`, in a folder of its own; `remove` deletes the folder. */
async function oneMigration(schema: string, sql: string) {
  const directory = await mkdtemp(path.join(os.tmpdir(), `${schema}-`))
  await writeFile(path.join(directory, `001_${schema}.sql`), sql)
  return { set: { schema, directory }, remove: () => rm(directory, { recursive: true, force: true }) }
}
