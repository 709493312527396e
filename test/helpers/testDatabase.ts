import { inject } from 'vitest'
import { createTestDatabase, type TestDatabase } from './postgres.ts'

/** A throwaway database for the calling test file, on the Postgres the run found. */
export function freshDatabase(): Promise<TestDatabase> {
  return createTestDatabase(inject('postgresAdminUrl'), inject('testRunId'))
}
