import { createHash } from 'node:crypto'
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import pg from 'pg'
import type { Logger } from 'pino'
import { dropConnection, endWithin, pendingStatement, withConnection } from './pool.ts'

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

/**
 * The folder's migrations in version order (numeric: 1000 comes after 999). A `.sql` file that
 * is not named `NNN_description.sql`, or a version two files share, is an error rather than a
 * migration silently never applied: versions are what the database records as done.
 */
async function readMigrations(directory: string): Promise<Migration[]> {
  const sqlFiles = (await readdir(directory)).filter((file) => file.endsWith('.sql'))
  const misnamed = sqlFiles.filter((file) => !FILE_NAME.test(file))
  if (misnamed.length > 0) {
    throw new Error(`${directory}: ${misnamed.join(', ')} not named NNN_description.sql (digits, an underscore, then lower-case letters, digits and underscores)`)
  }
  const migrations = await Promise.all(
    sqlFiles.map(async (file) => ({
      version: Number(FILE_NAME.exec(file)?.[1]),
      name: file,
      sql: await readFile(path.join(directory, file), 'utf8'),
    })),
  )
  migrations.sort((a, b) => a.version - b.version || a.name.localeCompare(b.name))
  const clashes: string[] = []
  for (let index = 1; index < migrations.length; index++) {
    const [before, after] = [migrations[index - 1]!, migrations[index]!]
    if (before.version === after.version) clashes.push(`${before.name} and ${after.name}`)
  }
  if (clashes.length > 0) throw new Error(`${directory}: ${clashes.join(', ')} share a version number`)
  return migrations
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
 *
 * A connection that goes mute (a failover to another host behind the address, a NAT or relay
 * that forgot it) would hold the start for ever: nothing bounds the wait for an answer. A
 * watch tells it from a long migration (see watchForSilence), and one found mute is closed and
 * fails the migration, within about 20 s, so that the service exits and its supervisor
 * starts it again on a fresh connection.
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
  const watch = watchForSilence(client, pool)
  const applied: number[] = []
  /** In one transaction under the lock: the first migration not applied yet, after creating the bookkeeping if need be. */
  const nextPending = async (): Promise<Migration | undefined> => {
    await watch.identifyBackend()
    await client.query(`SET LOCAL statement_timeout = 0`)
    await client.query(`SET LOCAL lock_timeout = ${MIGRATION_LOCK_TIMEOUT_MILLIS}`)
    // A session the client lost (gone mute) would otherwise keep the lock, and the restarted
    // service wait on it, until the server's TCP keepalive notices: hours.
    if (watch.watching()) await client.query(`SET LOCAL idle_in_transaction_session_timeout = ${ORPHANED_TRANSACTION_MILLIS}`)
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
      } finally {
        watch.transactionEnded()
      }
      if (!migration) break
      applied.push(migration.version)
      logger?.info({ schema: set.schema, migration: migration.name }, 'migration applied')
    }
  } catch (error) {
    const silence = watch.silence()
    if (silence === undefined) throw error
    throw new Error(`Postgres stopped answering on the migration connection (${silence}): closed it; starting again retries on a new connection`, { cause: error })
  } finally {
    watch.stop()
    // Closing the session ends a transaction left open by a lost connection, and its lock with it.
    // The goodbye is waited for a moment only: a mute server never sends it.
    await endWithin(client)
    client.off('error', onLost)
  }
  warnOfStrangers(set, migrations, recorded, logger)
  return applied
}

/** How long a migration transaction's session lives on after its client stops talking to it. */
const ORPHANED_TRANSACTION_MILLIS = 10_000

/** How long a statement waits for its answer before another connection looks at its session, or at whether Postgres answers at all. */
const WATCH_AFTER_MILLIS = 5_000
/** How long the server must have been waiting for the client, while the client waits for it, to call the connection mute. */
const BOTH_WAITING_MILLIS = 1_000
const LOOK_EVERY_MILLIS = 500
/** A statement at work for minutes is looked up every 2 s, not at every look. */
const LOOK_UP_EVERY_MILLIS = 2_000

/** A server session, as pg_stat_activity names it: pids are reused, so with its start. */
interface Session {
  pid: number
  backendStart: string
}

/**
 * Tells a connection gone mute from a statement that takes long (an index build, waiting up to
 * lock_timeout for another instance's migration), which no client-side deadline can. A statement
 * unanswered for 5 s has its session looked up from another connection of the pool: the
 * connection is mute when the server has no such session any more (failed over, or the session
 * ended on its side), when the session has been idle for a second while the client still waits
 * for its answer (the answer, or the statement, was lost on the way), or when that other
 * connection cannot even be made, twice in a row (the pool's 2 s to connect). One made whose
 * look-up goes unanswered proves nothing: behind a pooler whose server connections are all taken
 * (this migration's, other instances' waiting for its lock) the look-up waits its turn.
 * A session still at work is left to work, however long. On a direct connection the session is
 * the connection's, known after the first transaction (the server's pid is the one it gave at
 * login). Behind a transaction pooler each transaction may run on another session: its BEGIN, and
 * the first transaction's BEGIN and look-up of its session, have nothing to look up: they are mute
 * only if new connections cannot be made either (a BEGIN waits at the pooler for a server
 * connection for as long as others hold them all).
 *
 * Over a Unix socket nothing between client and server can lose the connection: no watch there.
 * Nor on PGlite (the embedded database), one session for every connection, which could not answer
 * the look-up while the migration holds it, nor where pg_stat_activity does not list the session.
 */
function watchForSilence(client: pg.Client, pool: pg.Pool) {
  const watched = !(client.host ?? '').startsWith('/')
  let session: Session | 'unknown' | 'not listed' = 'unknown'
  let silence: string | undefined
  let seen: { statement: object | null | undefined; since: number } = { statement: undefined, since: 0 }
  let looking = false
  let lookedAt = Number.NEGATIVE_INFINITY
  let unansweredLookups = 0
  const giveUp = (reason: string) => {
    silence = reason
    dropConnection(client)
  }
  const look = async () => {
    const statement = pendingStatement(client)
    const now = performance.now()
    if (statement !== seen.statement) {
      seen = { statement, since: now }
      return
    }
    if (!statement || looking || silence !== undefined) return
    const waited = now - seen.since
    if (session === 'not listed') return
    const known = typeof session === 'object' ? session : undefined
    if (waited < WATCH_AFTER_MILLIS || now - lookedAt < LOOK_UP_EVERY_MILLIS) return
    looking = true
    lookedAt = now
    try {
      const { mute, unanswered } = await lookAtSession(pool, known)
      // A look-up unanswered once may be a busy server slow to take a connection: twice, it is not.
      unansweredLookups = unanswered === undefined ? 0 : unansweredLookups + 1
      const reason = mute ?? (unansweredLookups >= 2 ? unanswered : undefined)
      if (reason !== undefined && pendingStatement(client) === statement) giveUp(reason)
    } finally {
      looking = false
    }
  }
  const looker = watched ? setInterval(() => void look(), LOOK_EVERY_MILLIS).unref() : undefined
  return {
    /** Whether the transaction's session is known, so that it can be watched. */
    watching: () => typeof session === 'object',
    /** Reads which server session runs the transaction just begun. */
    async identifyBackend(): Promise<void> {
      if (!watched) return
      const { rows } = await client.query<{ pid: number; backend_start: string }>(
        `SELECT pid, backend_start::text AS backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid() AND version() NOT LIKE '%PGlite%'`,
      )
      session = rows[0] ? { pid: rows[0].pid, backendStart: rows[0].backend_start } : 'not listed'
    },
    /** The next transaction may run on another session (behind a transaction pooler); one not listed stays so. */
    transactionEnded(): void {
      if (typeof session === 'object' && session.pid !== (client as unknown as { processID: number | null }).processID) session = 'unknown'
    },
    /** Why the connection was closed as mute, if it was. */
    silence: () => silence,
    stop: () => clearInterval(looker),
  }
}

/** What another connection learns of the session: why its connection is mute, or that it got no answer itself. */
async function lookAtSession(pool: pg.Pool, session: Session | undefined): Promise<{ mute?: string; unanswered?: string }> {
  let connected = false
  try {
    const rows = await withConnection(pool, async (client) => {
      connected = true
      // Asked something even so: a connection idle in the pool proves nothing until it answers
      // (unanswered, the pool's sweep closes it and the idle ones with it).
      if (!session) return void (await client.query('SELECT 1'))
      const result = await client.query<{ state: string | null; state_millis: number | null }>(
        `SELECT state, (extract(epoch FROM clock_timestamp() - state_change) * 1000)::float8 AS state_millis
           FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2::timestamptz`,
        [session.pid, session.backendStart],
      )
      return result.rows
    })
    if (!rows) return {}
    const row = rows[0]
    if (!row) return { mute: 'the server has no session for it any more' }
    if (row.state?.startsWith('idle') && (row.state_millis ?? 0) >= BOTH_WAITING_MILLIS) {
      return { mute: `the server has been ${row.state} for ${Math.round(row.state_millis ?? 0)} ms while the client waits for its answer` }
    }
    return {}
  } catch (error) {
    // The server's refusal (out of connection slots, say) is an answer: it is there.
    if (error instanceof pg.DatabaseError) return {}
    // A connection made and its look-up unanswered is a server there but busy, or a pooler whose
    // server connections are all taken (by this migration and other instances waiting for its
    // lock): it queues the look-up for as long as the migration runs.
    if (connected) return {}
    return { unanswered: `a new connection got no answer either: ${error instanceof Error ? error.message : String(error)}` }
  }
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
