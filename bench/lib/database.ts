import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import pg from 'pg'
import { startEmbeddedPostgres } from '../../common/src/database/embeddedPostgres.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { printableUrl } from '../../common/src/database/printableUrl.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'

const LOCAL_DEFAULT = 'postgres://postgres@127.0.0.1:5432/postgres'
export const BENCH_DATABASE_PREFIX = 'aas_bench_'
const BENCH_DATABASE_NAME = /^aas_bench_[0-9a-f]{12}$/

export interface PostgresServer {
  /** Admin connection string (the maintenance database), password removed for display. */
  displayUrl: string
  url: string
  /** "DATABASE_URL", "local default" or "embedded (PGlite)". */
  source: string
  version: string
  /** Set when the benchmark fell back to something other than a real server. */
  warning?: string
  stop(): Promise<void>
}

async function serverVersion(url: string): Promise<string | undefined> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 })
  try {
    await client.connect()
    const { rows } = await client.query<{ version: string }>("SELECT current_setting('server_version') AS version")
    return rows[0]?.version
  } catch {
    return undefined
  } finally {
    await client.end().catch(() => undefined)
  }
}

/**
 * DATABASE_URL when set, else the local server; if that does not answer, an embedded PGlite
 * (which runs inside this process and so competes with the load generator for CPU).
 */
export async function findPostgres(env: NodeJS.ProcessEnv = process.env): Promise<PostgresServer> {
  const candidate = env.DATABASE_URL || LOCAL_DEFAULT
  const source = env.DATABASE_URL ? 'DATABASE_URL' : 'local default'
  const version = await serverVersion(candidate)
  if (version !== undefined) {
    return { url: candidate, displayUrl: printableUrl(candidate), source, version, stop: async () => undefined }
  }
  const embedded = await startEmbeddedPostgres()
  return {
    url: embedded.url,
    displayUrl: embedded.url,
    source: 'embedded (PGlite)',
    version: (await serverVersion(embedded.url)) ?? 'unknown',
    warning:
      `Postgres did not answer at ${printableUrl(candidate)} (${source}); fell back to an embedded PGlite ` +
      'running inside the benchmark process. It shares a CPU with the load generator and is single-backend: ' +
      'these numbers are NOT comparable with runs against a real server.',
    stop: () => embedded.stop(),
  }
}

function isLoopback(url: string): boolean {
  const host = new URL(url).hostname
  return host === 'localhost' || host === '[::1]' || host.startsWith('127.')
}

/** True when `pid` is a postgres process on this machine (a remote server's pids mean nothing here). */
function isLocalPostgres(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim().startsWith('postgres')
  } catch {
    return false
  }
}

function withDatabase(url: string, database: string): string {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

export interface BenchDatabase {
  name: string
  url: string
  /**
   * Process ids of the Postgres backends connected to this database, when Postgres runs on this
   * machine (its /proc entries are readable); empty otherwise.
   */
  backendPids(): Promise<number[]>
  /** Drops this database and nothing else; safe to call twice. */
  drop(): Promise<void>
}

/** Creates `aas_bench_<random>`, applies the pets migrations and seeds `pets` rows. */
export async function createBenchDatabase(adminUrl: string, pets: number): Promise<BenchDatabase> {
  const name = `${BENCH_DATABASE_PREFIX}${randomBytes(6).toString('hex')}`
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  try {
    await admin.query(`CREATE DATABASE "${name}"`)
  } finally {
    await admin.end()
  }
  let dropped = false
  const database: BenchDatabase = {
    name,
    url: withDatabase(adminUrl, name),
    async backendPids() {
      if (!isLoopback(adminUrl)) return []
      const client = new pg.Client({ connectionString: adminUrl })
      try {
        await client.connect()
        const { rows } = await client.query<{ pid: number }>(
          'SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
          [name],
        )
        const pids = rows.map((row) => row.pid)
        return pids.every((pid) => isLocalPostgres(pid)) ? pids : []
      } catch {
        return []
      } finally {
        await client.end().catch(() => undefined)
      }
    },
    async drop() {
      if (dropped) return
      if (!BENCH_DATABASE_NAME.test(name)) throw new Error(`refusing to drop ${name}`)
      const client = new pg.Client({ connectionString: adminUrl })
      await client.connect()
      try {
        await client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
        dropped = true
      } finally {
        await client.end()
      }
    },
  }
  try {
    const pool = createPool({ connectionString: database.url, applicationName: 'bench-setup', max: 1 })
    try {
      await migrate(pool, PETS_MIGRATIONS)
      await pool.query(
        `INSERT INTO pets.pets (name, category_id, status)
         SELECT 'pet ' || g, 1 + g % 12, (ARRAY['available', 'pending', 'sold'])[1 + g % 3]
           FROM generate_series(1, $1::int) AS g`,
        [pets],
      )
      await pool.query('ANALYZE pets.pets')
    } finally {
      await pool.end()
    }
  } catch (error) {
    await database.drop().catch(() => undefined)
    throw error
  }
  return database
}
