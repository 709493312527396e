import { afterAll, beforeAll, inject } from 'vitest'
import { createTestDatabase, type TestDatabase } from './postgres.ts'

/** A throwaway database for the calling test file, on the Postgres the run found. */
export function freshDatabase(): Promise<TestDatabase> {
  return createTestDatabase(inject('postgresAdminUrl'), inject('testRunId'))
}

export interface SuiteDatabase {
  /** The database's URL, in hooks and tests (not while the suite is being collected). */
  readonly url: string
}

/**
 * A throwaway database for the enclosing describe block (or file, called at its top level): made
 * in a beforeAll, dropped in an afterAll. Call it before the block's own hooks: those then start
 * once the database exists and, as vitest runs "after" hooks in reverse order, close what uses
 * it before it is dropped.
 */
export function suiteDatabase(): SuiteDatabase {
  let database: TestDatabase | undefined
  beforeAll(async () => {
    database = await freshDatabase()
  })
  afterAll(async () => {
    await database?.drop()
  })
  return {
    get url() {
      if (!database) throw new Error('the suite database is made in beforeAll: read its url in a hook or a test')
      return database.url
    },
  }
}
