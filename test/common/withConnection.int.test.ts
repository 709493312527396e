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
