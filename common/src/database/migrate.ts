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
 * Applies pending migrations, each in its own transaction, so that two instances starting
 * together apply each migration exactly once: every transaction first takes the schema's
 * advisory lock (a transaction lock, released by its COMMIT or ROLLBACK), then reads what is
 * applied and applies the next one. Not a session lock: behind a transaction pooler (PgBouncer
 * with pool_mode = transaction) each statement outside a transaction may run on another server
 * connection, so a session lock stayed held on a pooled connection after this client left, and
 * every later start and keys CLI run waited on it.
 *
 * On a connection of its own, outside the pool's request bounds (a 5 s statement_timeout and the
 * client-side sweep): an instance waiting for another's migration, or a migration building an
 * index, takes as long as it takes. Waiting for a lock is bounded by lock_timeout instead (5 min).
 * Both are set in each transaction (SET LOCAL), not as connection parameters, which a pooler
 * refuses or drops.
 */
export async function migrate(pool: pg.Pool, set: MigrationSet, logger?: Logger): Promise<number[]> {
  const migrations = await readMigrations(set.directory)
  const { statement_timeout: _statementTimeout, idle_in_transaction_session_timeout: _idleTimeout, ...connection } = pool.options
  const client = new pg.Client(connection)
  // A connection lost while migrating would otherwise be an unhandled 'error' event, a crash
  // instead of the failed query's error.
  const onLost = () => undefined
  client.on('error', onLost)
  const lock = lockId(set.schema).toString()
  const table = `${quoteIdentifier(set.schema)}.schema_migrations`
  const applied: number[] = []
  /** In one transaction under the lock: the first migration not applied yet, after creating the bookkeeping if need be. */
  const nextPending = async (): Promise<Migration | undefined> => {
    await client.query(`SET LOCAL statement_timeout = 0`)
    await client.query(`SET LOCAL lock_timeout = ${MIGRATION_LOCK_TIMEOUT_MILLIS}`)
    await client.query('SELECT pg_advisory_xact_lock($1::bigint)', [lock])
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdentifier(set.schema)}`)
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${table} (
         version integer PRIMARY KEY,
         name text NOT NULL,
         applied_at timestamptz NOT NULL DEFAULT now()
       )`,
    )
    const { rows } = await client.query<{ version: number; name: string }>(`SELECT version, name FROM ${table} ORDER BY version`)
    recorded = rows
    const done = new Set(rows.map((row) => row.version))
    return migrations.find((migration) => !done.has(migration.version))
  }
  let recorded: { version: number; name: string }[] = []
  try {
    await client.connect()
    for (;;) {
      await client.query('BEGIN')
      let migration: Migration | undefined
      try {
        migration = await nextPending()
        if (migration) {
          await client.query(migration.sql)
          await client.query(`INSERT INTO ${table} (version, name) VALUES ($1, $2)`, [migration.version, migration.name])
        }
        await client.query('COMMIT')
      } catch (error) {
        await client.query('ROLLBACK').catch(() => undefined)
        throw migration ? new Error(`migration ${migration.name} failed`, { cause: error }) : error
      }
      if (!migration) break
      applied.push(migration.version)
      logger?.info({ schema: set.schema, migration: migration.name }, 'migration applied')
    }
  } finally {
    // Closing the session ends a transaction left open by a lost connection, and its lock with it.
    await client.end().catch(() => undefined)
    client.off('error', onLost)
  }
  warnOfStrangers(set, migrations, recorded, logger)
  return applied
}

/**
 * Migrations are matched by number: a number recorded under another file's name (a file renumbered
 * after it ran: 011 mends the one case there was) or with no file here (a newer version migrated
 * this database) means this version may be missing what it expects, so it says which.
 */
function warnOfStrangers(set: MigrationSet, migrations: Migration[], recorded: { version: number; name: string }[], logger?: Logger): void {
  const files = new Map(migrations.map((migration) => [migration.version, migration.name]))
  const strangers = recorded.filter(({ version, name }) => files.get(version) !== name)
  if (strangers.length === 0) return
  logger?.warn(
    {
      schema: set.schema,
      recorded: strangers.map(({ version, name }) => ({ version, name, file: files.get(version) ?? null })),
    },
    'the database records migrations this version has no file for, or under another file\'s name: it was migrated by another version',
  )
}

function quoteIdentifier(name: string): string {
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`invalid schema name: ${name}`)
  return `"${name}"`
}
