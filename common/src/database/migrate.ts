import { createHash } from 'node:crypto'
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import pg from 'pg'
import type { Logger } from 'pino'

export interface MigrationSet {
  /** Postgres schema the migrations own; also names the bookkeeping table and the lock. */
  schema: string
  /** Folder of `NNN_description.sql` files, applied in numeric order. */
  directory: string
}

interface Migration {
  version: number
  name: string
  sql: string
}

const FILE_NAME = /^(\d{3,})_[a-z0-9_]+\.sql$/

async function readMigrations(directory: string): Promise<Migration[]> {
  const files = (await readdir(directory)).filter((file) => FILE_NAME.test(file)).sort()
  return Promise.all(
    files.map(async (file) => ({
      version: Number(FILE_NAME.exec(file)?.[1]),
      name: file,
      sql: await readFile(path.join(directory, file), 'utf8'),
    })),
  )
}

/** How long a migration may wait for a lock (another instance's migration lock, a table's) before failing. */
const MIGRATION_LOCK_TIMEOUT_MILLIS = 300_000

/** A 64-bit advisory lock id derived from the schema name, so each schema has its own lock. */
function lockId(schema: string): bigint {
  return createHash('sha256').update(`migrations:${schema}`).digest().readBigInt64BE(0)
}

/**
 * Applies pending migrations, each in its own transaction, under a session advisory lock so
 * that two instances starting together apply each migration exactly once.
 *
 * On a connection of its own, outside the pool's request bounds (a 5 s statement_timeout and the
 * client-side sweep): an instance waiting for another's migration, or a migration building an
 * index, takes as long as it takes. Waiting for a lock is bounded by lock_timeout instead (5 min).
 */
export async function migrate(pool: pg.Pool, set: MigrationSet, logger?: Logger): Promise<number[]> {
  const migrations = await readMigrations(set.directory)
  const { statement_timeout: _statementTimeout, idle_in_transaction_session_timeout: _idleTimeout, ...connection } = pool.options
  const client = new pg.Client({ ...connection, statement_timeout: 0, lock_timeout: MIGRATION_LOCK_TIMEOUT_MILLIS })
  // A connection lost while migrating would otherwise be an unhandled 'error' event, a crash
  // instead of the failed query's error.
  const onLost = () => undefined
  client.on('error', onLost)
  const lock = lockId(set.schema).toString()
  const applied: number[] = []
  try {
    await client.connect()
    await client.query('SELECT pg_advisory_lock($1::bigint)', [lock])
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdentifier(set.schema)}`)
    const table = `${quoteIdentifier(set.schema)}.schema_migrations`
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${table} (
         version integer PRIMARY KEY,
         name text NOT NULL,
         applied_at timestamptz NOT NULL DEFAULT now()
       )`,
    )
    const { rows } = await client.query<{ version: number }>(`SELECT version FROM ${table}`)
    const done = new Set(rows.map((row) => row.version))
    for (const migration of migrations) {
      if (done.has(migration.version)) continue
      await client.query('BEGIN')
      try {
        await client.query(migration.sql)
        await client.query(`INSERT INTO ${table} (version, name) VALUES ($1, $2)`, [migration.version, migration.name])
        await client.query('COMMIT')
      } catch (error) {
        await client.query('ROLLBACK').catch(() => undefined)
        throw new Error(`migration ${migration.name} failed`, { cause: error })
      }
      applied.push(migration.version)
      logger?.info({ schema: set.schema, migration: migration.name }, 'migration applied')
    }
  } finally {
    // Closing the session releases its advisory lock too, lost connection or not.
    await client.end().catch(() => undefined)
    client.off('error', onLost)
  }
  return applied
}

function quoteIdentifier(name: string): string {
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`invalid schema name: ${name}`)
  return `"${name}"`
}
