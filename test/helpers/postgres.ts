import { randomBytes } from 'node:crypto'
import pg from 'pg'

/**
 * Where the integration tests find Postgres: DATABASE_URL when set, else the local server on
 * 127.0.0.1:5432, else a testcontainers Postgres when a Docker engine is reachable. Tests only
 * ever create and drop their own databases (named with TEST_DATABASE_PREFIX and this run's id).
 */
export const TEST_DATABASE_PREFIX = 'aas_test_'
const LOCAL_DEFAULT = 'postgres://postgres@127.0.0.1:5432/postgres'

/** True when a Postgres at `url` accepts a connection and answers a query within the timeout. */
export async function reachable(url: string, timeoutMillis = 2_000): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: timeoutMillis })
  // A server that drops the connection reports it as an 'error' event too.
  client.on('error', () => undefined)
  try {
    await client.connect()
    await client.query('SELECT 1')
    return true
  } catch {
    return false
  } finally {
    await client.end().catch(() => undefined)
  }
}

export interface AdminConnection {
  url: string
  stop(): Promise<void>
}

export async function findPostgres(env: NodeJS.ProcessEnv = process.env): Promise<AdminConnection> {
  const configured = env.DATABASE_URL
  if (configured) {
    if (!(await reachable(configured))) throw new Error('DATABASE_URL is set but Postgres does not answer there')
    return { url: configured, stop: async () => undefined }
  }
  if (await reachable(LOCAL_DEFAULT)) return { url: LOCAL_DEFAULT, stop: async () => undefined }
  // Only machines with a Docker engine get here; the import stays lazy so others never load it.
  const { PostgreSqlContainer } = await import('@testcontainers/postgresql')
  const container = await new PostgreSqlContainer('postgres:17-alpine').start()
  return { url: container.getConnectionUri(), stop: async () => void (await container.stop()) }
}

function withDatabase(url: string, database: string): string {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

export interface TestDatabase {
  url: string
  name: string
  drop(): Promise<void>
}

/** A fresh, empty database for one test file; `drop` removes it and nothing else. */
export async function createTestDatabase(adminUrl: string, runId: string): Promise<TestDatabase> {
  const name = `${TEST_DATABASE_PREFIX}${runId}_${randomBytes(4).toString('hex')}`
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  try {
    await admin.query(`CREATE DATABASE "${name}"`)
  } finally {
    await admin.end()
  }
  return {
    name,
    url: withDatabase(adminUrl, name),
    drop: () => dropDatabases(adminUrl, (existing) => existing === name),
  }
}

/** Drops the databases whose names `match` accepts (always within the test prefix). */
export async function dropDatabases(adminUrl: string, match: (name: string) => boolean): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  try {
    const { rows } = await admin.query<{ datname: string }>(
      'SELECT datname FROM pg_database WHERE datname LIKE $1',
      [`${TEST_DATABASE_PREFIX}%`],
    )
    for (const { datname } of rows.filter((row) => match(row.datname))) {
      await admin.query(`DROP DATABASE IF EXISTS "${datname}" WITH (FORCE)`)
    }
  } finally {
    await admin.end()
  }
}
