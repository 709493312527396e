import { randomBytes } from 'node:crypto'
import type { TestProject } from 'vitest/node'
import { TEST_DATABASE_PREFIX, dropDatabases, findPostgres } from './postgres.ts'
import { keyNames, keyShapedNames } from './redis.ts'

declare module 'vitest' {
  export interface ProvidedContext {
    postgresAdminUrl: string
    testRunId: string
  }
}

/**
 * After the run: the Redis key names still under the tests' prefix (`aas-test:`), read with SCAN
 * and left as they are, must hold nothing shaped like an API key. (Each test file's own cleanup,
 * deleteKeysWithPrefix, checks the same of every name it deletes.) No Redis: nothing to scan.
 */
async function scanTestKeyNames(): Promise<void> {
  const names = await keyNames('aas-test:*').catch(() => [])
  const leaked = keyShapedNames(names)
  if (leaked.length === 0) return
  // vitest reports an error thrown here but still exits 0: the run fails through the exit code.
  process.exitCode = 1
  throw new Error(`Redis key names under aas-test: held an API key: ${leaked.slice(0, 5).join(', ')}`)
}

/** Finds Postgres once per run; at the end drops every database this run created and scans Redis key names. */
export default async function setup(project: TestProject) {
  const postgres = await findPostgres()
  const runId = randomBytes(3).toString('hex')
  project.provide('postgresAdminUrl', postgres.url)
  project.provide('testRunId', runId)
  return async () => {
    try {
      await scanTestKeyNames()
    } finally {
      await dropDatabases(postgres.url, (name) => name.startsWith(`${TEST_DATABASE_PREFIX}${runId}_`))
      await postgres.stop()
    }
  }
}
