import type pg from 'pg'
import type { Logger } from 'pino'
import { EnvError } from '../env.ts'
import { refusesConnectionsForNow, socketFileMissing } from './pool.ts'
import { loginRefusalFix } from './privileges.ts'

/**
 * A Postgres that is not there yet, rather than one that refuses this service: not listening or
 * unreachable for now (it starts after this process, restarts, fails over; on a Unix socket, its
 * socket file missing), still starting (57P03), out of connection slots (53300), or taking no
 * connections to the database for now (refusesConnectionsForNow).
 */
const NOT_YET = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'ENOTFOUND', 'EPIPE', '57P03', '53300'])

/**
 * PgBouncer answers every refusal with 08P01, those waiting cannot mend ("unsupported startup
 * parameter", "no such database") and these alike: its words for a Postgres behind it that is not
 * there yet (down, restarting, its name not resolving yet) and for its own client slots being full.
 */
const PGBOUNCER_NOT_YET =
  /^(server login has been failing|pgbouncer cannot connect to server|server DNS lookup failed|server conn crashed|no more connections allowed|query_wait_timeout|client_login_timeout \(server down\))/

export function postgresNotThereYet(error: unknown): boolean {
  const { code, message } = error as { code?: string; message?: string }
  // pg's own words for a connection closed or not made in time carry no code. Only those: a
  // server's refusal has a code, and its words may say timeout too (PgBouncer's 08P01
  // "unsupported startup parameter: statement_timeout" was waited for, for ever).
  if (code === '08P01') return PGBOUNCER_NOT_YET.test(message ?? '')
  if (socketFileMissing(error) || refusesConnectionsForNow(error)) return true
  if (code !== undefined) return NOT_YET.has(code)
  return /^Connection terminated|timeout/i.test(message ?? '')
}

const describe = (error: unknown) => {
  const { code, message } = error as { code?: string; message?: string }
  return [code, message?.split('\n')[0]?.slice(0, 200)].filter(Boolean).join(': ') || String(error)
}

/**
 * What to do about a DATABASE_URL pg cannot parse (its TypeError ERR_INVALID_URL, "Invalid URL"):
 * most often a password holding `/`, `#`, `@` or `%` as written, which ends the URL's parts early.
 */
export const UNPARSABLE_DATABASE_URL =
  'DATABASE_URL does not parse as a URL: percent-encode / @ # % in its password (or leave the password out of it and set PGPASSWORD), ' +
  'and keep its port within 1-65535'

/** Whether pg refused DATABASE_URL itself, before any connection: waiting cannot mend it. */
export function unparsableDatabaseUrl(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'ERR_INVALID_URL'
}

const FIRST_RETRY_MILLIS = 500
const MAX_RETRY_MILLIS = 5_000

/**
 * Waits until Postgres answers, retrying with a capped backoff while it is not there yet, so a
 * service started before its database (a host booting, an orchestrator starting everything at
 * once, Postgres restarting) comes up once it appears instead of exiting. Each new problem is
 * logged once. A refusal that waiting cannot mend (wrong password, no such database) is thrown
 * at once, naming Postgres.
 */
export async function waitForPostgres(pool: pg.Pool, logger: Logger): Promise<void> {
  let retryMillis = FIRST_RETRY_MILLIS
  let lastProblem: string | undefined
  for (;;) {
    try {
      await pool.query('SELECT 1')
      if (lastProblem !== undefined) logger.info('Postgres answers: starting')
      return
    } catch (error) {
      // The operator's to mend, like a bad setting: one line, no stack (its message is the cause's).
      if (!postgresNotThereYet(error)) {
        const fix = unparsableDatabaseUrl(error) ? UNPARSABLE_DATABASE_URL : loginRefusalFix(error, pool)
        throw new EnvError(`cannot use Postgres at DATABASE_URL: ${describe(error)}${fix === undefined ? '' : `; ${fix}`}`)
      }
      const problem = describe(error)
      if (problem !== lastProblem) logger.warn({ problem, retryInMillis: retryMillis, retryAtMostEveryMillis: MAX_RETRY_MILLIS }, 'waiting for Postgres at DATABASE_URL')
      lastProblem = problem
      await new Promise((resolve) => setTimeout(resolve, retryMillis))
      retryMillis = Math.min(retryMillis * 2, MAX_RETRY_MILLIS)
    }
  }
}
