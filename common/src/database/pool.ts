import pg from 'pg'
import type { Logger } from 'pino'
import { DEFAULT_POOL_SIZE, sslFilesOf } from '../env.ts'
import { postgresRefusal } from './privileges.ts'

export interface PoolOptions {
  connectionString: string
  applicationName: string
  max?: number
  /** How long a request may wait for a connection before it is answered 503. */
  connectionTimeoutMillis?: number
  /** Cap on one statement: on the server, and on the client for a server that stops answering. */
  statementTimeoutMillis?: number
  logger?: Logger
}

const INT8_OID = 20

/**
 * int8 columns arrive as strings by default. Every id this system stores is capped at
 * 2^53 − 1 by its column's CHECK constraint or sequence, so converting to a number is exact.
 */
const types = {
  getTypeParser(oid: number, format?: 'text' | 'binary') {
    if (oid === INT8_OID && format !== 'binary') return (value: string) => Number(value)
    return pg.types.getTypeParser(oid, format)
  },
}

export function createPool(options: PoolOptions): pg.Pool {
  const statementTimeout = options.statementTimeoutMillis ?? 5_000
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    application_name: options.applicationName,
    max: options.max ?? DEFAULT_POOL_SIZE,
    connectionTimeoutMillis: options.connectionTimeoutMillis ?? 2_000,
    idleTimeoutMillis: 30_000,
    statement_timeout: statementTimeout,
    idle_in_transaction_session_timeout: 10_000,
    types,
  })
  // An idle client losing its connection (Postgres restarted) must not crash the process.
  // Only message and code: the error object carries the whole client, kilobytes per line. One the
  // sweep closed as gone mute was told of already, in the sweep's one line for them all.
  pool.on('error', (error: Error & { code?: string }, client: pg.PoolClient) => {
    if (closedAsMute.has(client)) return
    options.logger?.warn({ error: error.message, code: error.code }, 'idle Postgres connection lost')
  })
  boundStatementsOnClient(pool, statementTimeout + STATEMENT_GRACE_MILLIS, options.logger)
  trackConnections(pool)
  for (const [, file] of sslFilesOf(options.connectionString ?? '')) sslFilesInUse.add(file)
  return pool
}

/**
 * The files DATABASE_URL names for pg to read at each new connection (sslrootcert, sslcert,
 * sslkey). Checked at start (databaseUrlFromEnv); one that cannot be read later (removed, a
 * rotation half done) fails each new connection as Postgres down would, until it is back.
 */
const sslFilesInUse = new Set<string>()

/**
 * Runs `work` on one connection of the pool, then gives it back; one whose work failed is dropped
 * rather than returned in a state no one knows (a transaction left open). While a connection is
 * checked out, pg-pool's own 'error' listener is off it: a connection lost then (Postgres
 * restarted, a network cut) would be an uncaught exception and end the process. The failing query
 * reports it to `work`; this listener only keeps the process alive. `answerWithinMillis`: a tighter
 * client-side bound for this work's statements than the pool's (watchAnswers).
 */
export async function withConnection<T>(
  pool: pg.Pool,
  work: (client: pg.PoolClient) => Promise<T>,
  options: { answerWithinMillis?: number } = {},
): Promise<T> {
  const client = await pool.connect()
  const reportedByTheQuery = () => undefined
  client.on('error', reportedByTheQuery)
  const unwatch = options.answerWithinMillis === undefined ? undefined : watchAnswers(pool, client, options.answerWithinMillis)
  try {
    const result = await work(client)
    client.removeListener('error', reportedByTheQuery)
    client.release()
    return result
  } catch (error) {
    client.removeListener('error', reportedByTheQuery)
    client.release(error instanceof Error ? error : true)
    throw error
  } finally {
    unwatch?.()
  }
}

/** Each pool's way to close a connection found mute, and its idle ones with it (boundStatementsOnClient). */
const muteClosers = new WeakMap<pg.Pool, (client: pg.PoolClient, boundMillis: number) => void>()

/**
 * A tighter client-side bound than the pool's, for work whose statements answer at once when
 * Postgres is there (withConnection's answerWithinMillis): a statement that has read no byte for
 * `millis` loses its connection, and the pool's idle connections go with it, as at the pool's own
 * bound (boundStatementsOnClient). The pool's bound waits out the server's statement timeout
 * first, 5.5 s, which the key-change feed cannot spend. Checked every twentieth of the bound, and
 * again after one turn of the event loop, which reads an answer already waiting in the socket.
 */
function watchAnswers(pool: pg.Pool, client: pg.PoolClient, millis: number): () => void {
  const observed = client as unknown as ObservableClient
  let seen = { statement: observed._getActiveQuery(), bytesRead: observed.connection.stream.bytesRead, since: performance.now() }
  const timer = setInterval(() => {
    const now = performance.now()
    const statement = observed._getActiveQuery()
    if (!statement || !stillWaiting(observed, seen)) seen = { statement, bytesRead: observed.connection.stream.bytesRead, since: now }
    else if (now - seen.since >= millis) {
      clearInterval(timer)
      setImmediate(() => {
        if (!stillWaiting(observed, seen)) return
        const closeMute = muteClosers.get(pool)
        if (closeMute) closeMute(client, millis)
        else dropConnection(client)
      })
    }
  }, millis / 20)
  timer.unref()
  return () => clearInterval(timer)
}

/** How long past its server-side timeout a statement may run before the client gives up on it. */
const STATEMENT_GRACE_MILLIS = 500
const SWEEP_INTERVAL_MILLIS = 250

/** The pg internals the sweep reads: the statement a client is waiting on, if any, and its socket. */
interface ObservableClient {
  _getActiveQuery: () => object | null | undefined
  connection: { stream: { destroy(error?: Error): void; bytesRead: number } }
}

/** Whether `client` still waits on the same statement, with no byte of its answer read since. */
function stillWaiting(client: ObservableClient, seen: { statement: object | null | undefined; bytesRead: number }): boolean {
  return client._getActiveQuery() === seen.statement && client.connection.stream.bytesRead === seen.bytesRead
}

/** The statement `client` has sent and waits on the answer to, if any: the same object until it is answered. */
export function pendingStatement(client: pg.Client | pg.PoolClient): object | null | undefined {
  return (client as unknown as ObservableClient)._getActiveQuery()
}

/**
 * Closes a connection that stops answering: `end()` waits for the server's goodbye, which a mute
 * server never sends. Destroying the socket fails every statement on it at once and reports the
 * connection lost ('error', then 'end'), as a dropped network would.
 */
export function dropConnection(client: pg.Client | pg.PoolClient): void {
  ;(client as unknown as ObservableClient).connection.stream.destroy()
}

/** Connections the sweep closed while idle: their loss is expected, and logged once for them all. */
const closedAsMute = new WeakSet<object>()
const CLOSED_AS_MUTE = 'Connection terminated: closed idle beside a connection that gave no answer'

/**
 * statement_timeout needs a server that still runs; a server that stops answering in the middle
 * of a connection (hung host, silent network) would hold a request forever. pg's query_timeout
 * covers that with a timer per statement, but each timer's closure keeps the statement and its
 * rows alive through two young-generation collections (≈ 3 KB promoted per request, ≈ 10 µs of
 * GC per request in the bench). Instead, one sweep per pool looks at the statement each connection
 * is waiting on; one seen for longer than the bound loses its connection, which fails it and every
 * statement queued behind it ("Connection terminated unexpectedly", so 503) and takes the
 * connection out of the pool. A statement is thus failed at most bound + 2 sweeps after it began.
 *
 * The connections idle in the pool then went the same way (a failover to another host behind the
 * same address, a NAT or firewall that forgot them): found one by one, each would cost the next
 * request that took it the whole bound. They are closed with it, so the requests after the first
 * connect afresh. One log line per episode: further connections found mute within the bound of
 * the last are the same failure.
 */
function boundStatementsOnClient(pool: pg.Pool, boundMillis: number, logger?: Logger): void {
  const clients = new Map<ObservableClient, { statement: object | null | undefined; since: number; idle: boolean }>()
  let sweeper: NodeJS.Timeout | undefined
  let lastMuteAt = Number.NEGATIVE_INFINITY
  const sweep = () => {
    const now = performance.now()
    const overdue: { client: ObservableClient; statement: object; bytesRead: number }[] = []
    for (const [client, seen] of clients) {
      const statement = client._getActiveQuery()
      if (statement !== seen.statement) {
        seen.statement = statement
        seen.since = now
      } else if (statement && now - seen.since >= boundMillis) {
        overdue.push({ client, statement, bytesRead: client.connection.stream.bytesRead })
      }
    }
    if (overdue.length === 0) return
    // After the process was busy past the bound (its own work, a long GC pause), timers run before
    // the sockets are read: the answer may be waiting in one. Judged once they have been read.
    setImmediate(() => {
      const mute = overdue
        .filter((overdueOne) => clients.has(overdueOne.client) && stillWaiting(overdueOne.client, overdueOne))
        .map(({ client }) => client)
      if (mute.length > 0) closeMute(mute)
    })
  }
  const closeMute = (mute: ObservableClient[], boundOfThese = boundMillis) => {
    const now = performance.now()
    const idle = [...clients].filter(([client, seen]) => seen.idle && !mute.includes(client)).map(([client]) => client)
    for (const client of mute) {
      clients.delete(client)
      dropConnection(client as unknown as pg.Client)
    }
    // Closed as a plain drop, an idle connection stays in pg-pool's idle list until its socket's
    // close is reported, later in this turn of the event loop, and a request arriving meanwhile is
    // handed it and fails. A socket error is reported at the next tick, before any request is read.
    for (const client of idle) {
      clients.delete(client)
      closedAsMute.add(client)
      ;(client as unknown as ObservableClient).connection.stream.destroy(new Error(CLOSED_AS_MUTE))
    }
    if (now - lastMuteAt > boundMillis) {
      logger?.warn(
        { boundMillis: Math.round(boundOfThese), unansweredClosed: mute.length, idleClosed: idle.length },
        'Postgres gave no answer on a connection within the statement bound: closed it, and the idle ones with it',
      )
    }
    lastMuteAt = now
  }
  if (typeof (pg.Client.prototype as unknown as ObservableClient)._getActiveQuery !== 'function') {
    throw new Error('this pg version does not expose the active statement, which the client-side statement bound reads')
  }
  muteClosers.set(pool, (client, boundOfIt) => closeMute([client as unknown as ObservableClient], boundOfIt))
  pool.on('connect', (client) => {
    clients.set(client as unknown as ObservableClient, { statement: undefined, since: 0, idle: false })
    sweeper ??= setInterval(sweep, SWEEP_INTERVAL_MILLIS).unref()
  })
  const setIdle = (client: pg.PoolClient, idle: boolean) => {
    const seen = clients.get(client as unknown as ObservableClient)
    if (seen) seen.idle = idle
  }
  pool.on('acquire', (client) => setIdle(client, false))
  // Released with an error, it is being removed, not idle.
  pool.on('release', (error, client) => setIdle(client, !error))
  pool.on('remove', (client) => {
    clients.delete(client as unknown as ObservableClient)
    if (clients.size === 0 && sweeper) {
      clearInterval(sweeper)
      sweeper = undefined
    }
  })
}

/** How long a connection's end may wait for the server to confirm it: ample for one that answers. */
const END_MILLIS = 2_000

/**
 * Ends `client`'s session, waiting at most `millis` for Postgres to confirm it (pg's `end()` waits
 * for the server's goodbye, which a server gone mute never sends), then drops the connection.
 */
export async function endWithin(client: pg.Client, millis = END_MILLIS): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const ended = await Promise.race([
    client.end().then(() => true, () => true),
    new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), millis))),
  ])
  clearTimeout(timer)
  if (!ended) dropConnection(client)
}

/** Each pool's open connections, for endPool to drop those whose end Postgres never confirms. */
const openConnections = new WeakMap<pg.Pool, Set<pg.PoolClient>>()

function trackConnections(pool: pg.Pool): void {
  const open = new Set<pg.PoolClient>()
  openConnections.set(pool, open)
  pool.on('connect', (client) => open.add(client))
  pool.on('remove', (client) => open.delete(client))
}

/**
 * Ends the pool and waits at most `boundMillis` for Postgres to confirm the end of each connection,
 * then drops those it has not: pg's `end()` resolves at once but leaves each socket open until the
 * server's goodbye, which a server gone mute never sends, and a process that exits once its work
 * is done (the keys CLI) would wait for good.
 */
export async function endPool(pool: pg.Pool, boundMillis: number): Promise<void> {
  const open = openConnections.get(pool) ?? new Set<pg.PoolClient>()
  const allClosed = new Promise<void>((resolve) => {
    const resolveOnceNoneOpen = () => open.size === 0 && resolve()
    pool.on('remove', resolveOnceNoneOpen)
    resolveOnceNoneOpen()
  })
  let timer: NodeJS.Timeout | undefined
  const bound = new Promise<void>((resolve) => (timer = setTimeout(resolve, boundMillis)))
  await Promise.race([pool.end().then(() => allClosed), bound])
  clearTimeout(timer)
  for (const client of open) dropConnection(client)
}

/** Postgres's query_canceled: the statement timeout, or an operator's pg_cancel_backend. */
export const QUERY_CANCELED = '57014'

/** True when Postgres cancelled the statement (QUERY_CANCELED): it answered, and the connection is usable once its transaction is ended. */
export function isQueryCanceled(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === QUERY_CANCELED
}

// SQLSTATE classes 08 (connection exception) and 57 (operator intervention: shutdown,
// statement timeout) and 53 (insufficient resources) mean "try again later", not a bug. So does
// 25006 (read_only_sql_transaction): a write reaching a Postgres that takes none for now (a
// primary demoted in a failover, a standby behind the address, default_transaction_read_only set
// by an operator or by a managed service whose disk is nearly full); and 55P03
// (lock_not_available): a lock_timeout set for the database or role ended a wait on a lock an
// operator or a migration holds, where without it the statement timeout would have.
const UNAVAILABLE_SQLSTATE = /^(08|53|57)|^25006$|^55P03$/
// EMFILE and ENFILE: this process (or the host) has no file descriptor left for a new connection
// until others close; the database is as unreachable as if it refused, and as temporarily.
const UNAVAILABLE_NODE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'EMFILE', 'ENFILE'])
/**
 * Postgres refusing every new connection to the database for now (SQLSTATE 55000, its words): an
 * operator's `ALTER DATABASE … ALLOW_CONNECTIONS false` during maintenance, lifted the same way.
 * 55000 itself (object not in prerequisite state) also names statements' own faults.
 */
export function refusesConnectionsForNow(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  return code === '55000' && typeof message === 'string' && message.includes('is not currently accepting connections')
}

/**
 * A Postgres reached on a Unix socket that is not there: its socket file goes with the server
 * (stopped, restarting, not started yet), so this is its ECONNREFUSED.
 */
export function socketFileMissing(error: unknown): boolean {
  const { code, syscall } = (error ?? {}) as { code?: unknown; syscall?: unknown }
  return code === 'ENOENT' && syscall === 'connect'
}

const UNAVAILABLE_MESSAGES = [
  'timeout exceeded when trying to connect',
  'Connection terminated',
  'Client has encountered a connection error',
  'Cannot use a pool after calling end',
]

/**
 * True when an error means Postgres is unreachable or overloaded, or refuses this service's role
 * (privileges.ts), rather than a defect.
 */
export function isDatabaseUnavailable(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false
  if (postgresRefusal(error) !== undefined) return true
  const { code, message, syscall, path } = error as { code?: unknown; message?: unknown; syscall?: unknown; path?: unknown }
  if (typeof code === 'string' && (UNAVAILABLE_SQLSTATE.test(code) || UNAVAILABLE_NODE_CODES.has(code))) return true
  if (refusesConnectionsForNow(error) || socketFileMissing(error)) return true
  if (syscall === 'open' && typeof path === 'string' && sslFilesInUse.has(path)) return true
  if (error instanceof AggregateError) return error.errors.some(isDatabaseUnavailable)
  return typeof message === 'string' && UNAVAILABLE_MESSAGES.some((text) => message.includes(text))
}
