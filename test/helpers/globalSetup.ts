import { randomBytes } from 'node:crypto'
import type { TestProject } from 'vitest/node'
import { TEST_DATABASE_PREFIX, dropDatabases, findPostgres } from './postgres.ts'

declare module 'vitest' {
  export interface ProvidedContext {
    postgresAdminUrl: string
    testRunId: string
  }
}

/** Finds Postgres once per run; at the end drops every database this run created. */
export default async function setup(project: TestProject) {
  const postgres = await findPostgres()
  const runId = randomBytes(3).toString('hex')
  project.provide('postgresAdminUrl', postgres.url)
  project.provide('testRunId', runId)
  return async () => {
    await dropDatabases(postgres.url, (name) => name.startsWith(`${TEST_DATABASE_PREFIX}${runId}_`))
    await postgres.stop()
  }
}
