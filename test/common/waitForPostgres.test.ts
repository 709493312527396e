import pino from 'pino'
import { describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { postgresNotThereYet, waitForPostgres } from '../../common/src/database/waitForPostgres.ts'

describe('which Postgres errors a service waits out at start', () => {
  it('waits while Postgres is not there yet: unreachable, starting, out of slots, or pg saying a connection timed out or ended', () => {
    const waited = [
      Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }),
      Object.assign(new Error('the database system is starting up'), { code: '57P03' }),
      Object.assign(new Error('sorry, too many clients already'), { code: '53300' }),
      // A Unix socket folder whose server is stopped: its socket file goes with it.
      Object.assign(new Error('connect ENOENT /run/postgresql/.s.PGSQL.5432'), { code: 'ENOENT', syscall: 'connect' }),
      Object.assign(new Error('database "pets" is not currently accepting connections'), { code: '55000' }),
      new Error('Connection terminated due to connection timeout'),
      new Error('Connection terminated unexpectedly'),
      new Error('timeout exceeded when trying to connect'),
    ]
    for (const error of waited) expect(postgresNotThereYet(error), error.message).toBe(true)
  })

  it('waits while PgBouncer says the Postgres behind it is not there yet, though PgBouncer refuses everything with 08P01', () => {
    // PgBouncer 1.18's words, the first seen with Postgres down behind it (a service exited 1 at once).
    const waited = [
      'server login has been failing, try again later (server_login_retry)',
      'pgbouncer cannot connect to server',
      'server DNS lookup failed',
      'server conn crashed?',
      'no more connections allowed (max_client_conn)',
      'query_wait_timeout',
      'client_login_timeout (server down)',
    ].map((message) => Object.assign(new Error(message), { code: '08P01' }))
    for (const error of waited) expect(postgresNotThereYet(error), error.message).toBe(true)
  })

  it('gives up on a refusal that waiting cannot mend, even one whose words mention a timeout', () => {
    const refused = [
      Object.assign(new Error('password authentication failed for user "app"'), { code: '28P01' }),
      Object.assign(new Error('database "nope" does not exist'), { code: '3D000' }),
      // PgBouncer without ignore_startup_parameters: no retry makes it accept the parameter.
      Object.assign(new Error('unsupported startup parameter: statement_timeout'), { code: '08P01' }),
      Object.assign(new Error('no such database: nope'), { code: '08P01' }),
      // The same SQLSTATE for a statement's own fault, and a missing file that is no socket.
      Object.assign(new Error('cannot execute this on a table without replica identity'), { code: '55000' }),
      Object.assign(new Error("ENOENT: no such file or directory, open '/certs/root.crt'"), { code: 'ENOENT', syscall: 'open' }),
    ]
    for (const error of refused) expect(postgresNotThereYet(error), error.message).toBe(false)
  })

  // README: a password with / @ # % must be percent-encoded in the URL. Unencoded, the service
  // said only "ERR_INVALID_URL: Invalid URL".
  it('stops at once on a DATABASE_URL pg cannot parse (a password not percent-encoded), saying what to fix and not the password', async () => {
    const pool = createPool({ connectionString: 'postgres://app:pa/ss#w0rd@127.0.0.1:5432/pets', applicationName: 'test' })
    try {
      const refusal = await waitForPostgres(pool, pino({ level: 'silent' })).then(
        () => undefined,
        (error: unknown) => error as Error,
      )
      expect(refusal?.message).toMatch(/^cannot use Postgres at DATABASE_URL: .*percent-encode/)
      expect(refusal?.message).toContain('PGPASSWORD')
      expect(refusal?.message).not.toContain('w0rd')
    } finally {
      await pool.end()
    }
  })
})
