import { describe, expect, it } from 'vitest'
import { createPool, withConnection } from '../../common/src/database/pool.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

describe('a connection checked out of the pool', () => {
  const database = suiteDatabase()

  // pg-pool takes its own 'error' listener off a connection while it is checked out: one lost
  // then (Postgres restarted) was an uncaught exception, which ends a service (vitest reports it).
  it('lost between two statements fails the work, not the process, and the pool serves the next caller', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'with-connection-test' })
    const admin = createPool({ connectionString: database.url, applicationName: 'with-connection-admin' })
    try {
      const work = withConnection(pool, async (client) => {
        const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')
        await admin.query('SELECT pg_terminate_backend($1)', [rows[0]!.pid])
        // The connection is gone, and this statement is the first to hear of it.
        await new Promise((resolve) => setTimeout(resolve, 200))
        await client.query('SELECT 1')
      })
      await expect(work).rejects.toThrow()
      expect((await pool.query<{ answer: number }>('SELECT 42 AS answer')).rows).toEqual([{ answer: 42 }])
    } finally {
      await pool.end()
      await admin.end()
    }
  })
})

describe('the pool\'s bound on a statement the server does not answer', () => {
  const database = suiteDatabase()

  // The sweep runs on a timer, and after the process was busy timers run before the sockets are
  // read: an answer waiting in the socket was taken for no answer, its statement failed and the
  // idle connections closed with it.
  it('fails no statement whose answer came while the process was busy past the bound', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'sweep-busy-test', statementTimeoutMillis: 1_000 })
    try {
      await Promise.all([0, 1].map(() => pool.query('SELECT 1')))
      const answered = pool.query<{ answer: number }>('SELECT 42 AS answer FROM pg_sleep(0.4)')
      await new Promise((resolve) => setTimeout(resolve, 300))
      // Busy from a callback of its own (a request's work, a long GC pause): not within a timer.
      await new Promise<void>((resolve) =>
        setImmediate(() => {
          const busyUntil = performance.now() + 1_600
          while (performance.now() < busyUntil);
          resolve()
        }),
      )
      expect((await answered).rows).toEqual([{ answer: 42 }])
      expect(pool.totalCount).toBe(2)
    } finally {
      await pool.end()
    }
  })
})
