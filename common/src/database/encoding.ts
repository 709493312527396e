import type pg from 'pg'
import { EnvError } from '../env.ts'

/**
 * Start-up, both services: stops the service (EnvError, exit 1, one line) when its database does
 * not store text as UTF-8. The API takes any Unicode text (a pet's name, up to 100 characters), and
 * so do the keys CLI's key names: on a LATIN1 database a name outside Latin-1 ("Rex 🐶") cannot be
 * encoded at all, and on SQL_ASCII the 100-character CHECK counts bytes, so such names were
 * answered 500 while others were stored. The encoding is the database's for good (CREATE DATABASE
 * … ENCODING), so it is said once, at start.
 */
export async function requireUtf8Database(pool: pg.Pool): Promise<void> {
  const { rows: [row] } = await pool.query<{ database: string; encoding: string }>(
    `SELECT current_database() AS database, current_setting('server_encoding') AS encoding`,
  )
  if (!row || row.encoding.toUpperCase() === 'UTF8') return
  throw new EnvError(
    `cannot use Postgres at DATABASE_URL: the database "${row.database}" stores text as ${row.encoding}, which cannot hold every name the API and the keys CLI accept (Unicode); create it with ENCODING 'UTF8' (CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0) and point DATABASE_URL at that one`,
  )
}
