import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { pgbouncerAvailable, startPgBouncer, type PrivatePgBouncer } from '../helpers/pgbouncer.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/**
 * README (Configuration, PgBouncer): behind PgBouncer in transaction mode, each statement outside
 * a transaction may run on another server connection. The migration lock was a session lock:
 * it stayed held on the pooled server connection after the migrating process had gone, and the
 * next start (or `npm run keys`, which migrates first) waited on it until lock_timeout, 5 min,
 * even connected to Postgres directly.
 */
describe.skipIf(!pgbouncerAvailable())('migrations through PgBouncer in transaction mode', () => {
  const database = suiteDatabase()
  let pooler: PrivatePgBouncer | undefined

  beforeAll(async () => {
    pooler = await startPgBouncer(database.url, {
      pool_mode: 'transaction',
      default_pool_size: '4',
      // What the README tells operators to set: the pool's timeouts travel as startup parameters.
      ignore_startup_parameters: 'statement_timeout,idle_in_transaction_session_timeout',
    })
  }, 30_000)
  afterAll(async () => {
    await pooler?.close()
  })

  const advisoryLocksHeld = async (): Promise<number> => {
    const admin = new pg.Client({ connectionString: database.url })
    await admin.connect()
    try {
      const { rows } = await admin.query<{ held: number }>(
        `SELECT count(*)::int AS held FROM pg_locks l JOIN pg_stat_activity a USING (pid)
          WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()`,
      )
      return rows[0]?.held ?? -1
    } finally {
      await admin.end()
    }
  }

  it('apply every migration and leave no lock held on a pooled connection, so a later run, direct or pooled, does not wait', async () => {
    const pooled = createPool({ connectionString: pooler!.url, applicationName: 'migrate-pooler-test' })
    const direct = createPool({ connectionString: database.url, applicationName: 'migrate-pooler-test' })
    try {
      expect(await migrate(pooled, PETS_MIGRATIONS)).toHaveLength(3)
      expect(await migrate(pooled, GATEWAY_MIGRATIONS)).not.toHaveLength(0)
      // The pooler keeps its server connections open after the client has gone.
      expect(await advisoryLocksHeld()).toBe(0)
      // A second instance straight to Postgres (a deploy, the keys CLI) finds nothing to do, at once.
      const started = performance.now()
      expect(await migrate(direct, GATEWAY_MIGRATIONS)).toEqual([])
      expect(await migrate(direct, PETS_MIGRATIONS)).toEqual([])
      expect(performance.now() - started).toBeLessThan(5_000)
      // Two instances through the pooler at once: each migration still applied exactly once.
      const { rows } = await direct.query<{ n: number }>('SELECT count(*)::int AS n FROM pets.schema_migrations')
      expect(rows[0]?.n).toBe(3)
    } finally {
      await pooled.end()
      await direct.end()
    }
  }, 30_000)

  // Every server connection of the pooler can be taken at start: here one by this instance's
  // migration and one by another instance waiting for its lock. The watch for a mute connection
  // looks up the migration's session through the same pooler, where its look-up waits for a
  // server connection like any client: taken for a connection gone mute, the look-up unanswered
  // twice closed a migration at work, and every instance failed its start while any migration
  // outlasted ~17 s.
  /**
   * Two instances starting together behind a PgBouncer of `poolSize` server connections: the first
   * applies one migration of `seconds`, the second waits for its lock. What each migrate() gave.
   */
  async function twoInstancesBehind(poolSize: number, seconds: number, schema: string, statementTimeoutMillis?: number) {
    const pooler = await startPgBouncer(database.url, {
      pool_mode: 'transaction',
      default_pool_size: String(poolSize),
      ignore_startup_parameters: 'statement_timeout,idle_in_transaction_session_timeout',
    })
    const directory = await mkdtemp(path.join(os.tmpdir(), 'pooled-slow-migration-'))
    await writeFile(path.join(directory, '001_slow.sql'), `SELECT pg_sleep(${seconds}); CREATE TABLE ${schema}.done (id int);`)
    const set = { schema, directory }
    const first = createPool({ connectionString: pooler.url, applicationName: `${schema}-first`, statementTimeoutMillis })
    const second = createPool({ connectionString: pooler.url, applicationName: `${schema}-second`, statementTimeoutMillis })
    const outcome = (migrating: Promise<number[]>) =>
      migrating.then(
        (applied) => applied,
        (error: unknown) => (error instanceof Error ? error.message : String(error)),
      )
    try {
      const migrating = outcome(migrate(first, set))
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      const waiting = outcome(migrate(second, set))
      return { first: await migrating, second: await waiting }
    } finally {
      await first.end()
      await second.end()
      const direct = createPool({ connectionString: database.url, applicationName: 'migrate-pooler-test' })
      await direct.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).finally(() => direct.end())
      await pooler.close()
      await rm(directory, { recursive: true, force: true })
    }
  }

  // The two long migrations below share nothing (a pooler and a schema each): they run side by side.
  it.concurrent('let a long migration finish while the pooler has no server connection free for the watch\'s look-up', async ({ expect }) => {
    // The pools' statement bound at 1 s (1.5 s on the client, the pooler ignoring the server-side
    // setting): two look-ups that bound cut off came about 10 s into a migration, which needs to
    // outlast them.
    expect(await twoInstancesBehind(2, 13, 'pooled_slow', 1_000)).toEqual({ first: [1], second: [] })
  }, 90_000)

  // Another instance's BEGIN waits at the pooler for a server connection for as long as the
  // migration holds the last one: it was bounded at 10 s as a statement that takes milliseconds,
  // and that instance failed its start (exit 1), again and again until the migration ended.
  it.concurrent('let an instance wait at the pooler for a server connection for as long as another instance migrates', async ({ expect }) => {
    // Long enough for the second instance's BEGIN to wait past the 10 s it was once bounded at.
    expect(await twoInstancesBehind(1, 14, 'pooled_queued')).toEqual({ first: [1], second: [] })
  }, 90_000)
})
