import type pg from 'pg'

/**
 * Whether every pooled connection is a Postgres session of its own, so that a named prepared
 * statement one connection creates is invisible to the others. PGlite (the embedded default) is
 * one backend: its socket server queues every connection onto the same session, where the second
 * connection to prepare a name fails with 42P05 (duplicate_prepared_statement). Callers run
 * unnamed statements there.
 */
export async function connectionsHaveOwnSessions(pool: pg.Pool): Promise<boolean> {
  const { rows } = await pool.query<{ version: string }>('SELECT version()')
  return !(rows[0]?.version ?? '').includes('PGlite')
}
