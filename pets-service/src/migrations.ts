import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type { MigrationSet } from '../../common/src/database/migrate.ts'
import type { PostgresNeeds } from '../../common/src/database/privileges.ts'

/** The pets schema's numbered SQL migrations, applied at start under an advisory lock. */
export const PETS_MIGRATIONS: MigrationSet = {
  schema: 'pets',
  directory: path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'migrations'),
}

/**
 * What the pets-service's role must be granted (the owner of what its migrations made has it all
 * until someone revokes it). Migrations need CREATE on the database and the schema at every start
 * (CREATE … IF NOT EXISTS checks the privilege before it looks); the hourly purge deletes.
 */
export const PETS_POSTGRES_NEEDS: PostgresNeeds = {
  who: 'pets-service',
  schema: 'pets',
  serving: [
    { on: 'database', privileges: ['CONNECT'] },
    { on: 'schema', privileges: ['USAGE'] },
    { on: 'table', table: 'pets', privileges: ['SELECT', 'INSERT'] },
    { on: 'table', table: 'idempotency_keys', privileges: ['SELECT', 'INSERT', 'UPDATE'] },
  ],
  besides: [
    { on: 'database', privileges: ['CREATE'] },
    { on: 'schema', privileges: ['CREATE'] },
    { on: 'table', table: 'schema_migrations', privileges: ['SELECT', 'INSERT'] },
    { on: 'table', table: 'idempotency_keys', privileges: ['DELETE'] },
  ],
}
