import pg from 'pg'
import type { Logger } from 'pino'

export interface PoolOptions {
  connectionString: string
  applicationName: string
  max?: number
  /** How long a request may wait for a connection before it is answered 503. */
  connectionTimeoutMillis?: number
  /** Server-side cap on one statement. */
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
    max: options.max ?? 10,
    connectionTimeoutMillis: options.connectionTimeoutMillis ?? 2_000,
    idleTimeoutMillis: 30_000,
    statement_timeout: statementTimeout,
    // The client-side bound also covers a server that stopped answering altogether.
    query_timeout: statementTimeout + 1_000,
    idle_in_transaction_session_timeout: 10_000,
    types,
  })
  // An idle client losing its connection (Postgres restarted) must not crash the process.
  // Only message and code: the error object carries the whole client, kilobytes per line.
  pool.on('error', (error: Error & { code?: string }) =>
    options.logger?.warn({ error: error.message, code: error.code }, 'idle Postgres connection lost'),
  )
  return pool
}

// SQLSTATE classes 08 (connection exception) and 57 (operator intervention: shutdown,
// statement timeout) and 53 (insufficient resources) mean "try again later", not a bug.
const UNAVAILABLE_SQLSTATE = /^(08|53|57)/
const UNAVAILABLE_NODE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH'])
const UNAVAILABLE_MESSAGES = [
  'timeout exceeded when trying to connect',
  'Connection terminated',
  'Query read timeout',
  'Client has encountered a connection error',
  'Cannot use a pool after calling end',
]

/** True when an error means Postgres is unreachable or overloaded rather than a defect. */
export function isDatabaseUnavailable(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false
  const { code, message } = error as { code?: unknown; message?: unknown }
  if (typeof code === 'string' && (UNAVAILABLE_SQLSTATE.test(code) || UNAVAILABLE_NODE_CODES.has(code))) return true
  if (error instanceof AggregateError) return error.errors.some(isDatabaseUnavailable)
  return typeof message === 'string' && UNAVAILABLE_MESSAGES.some((text) => message.includes(text))
}
