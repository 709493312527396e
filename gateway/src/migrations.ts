import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type { MigrationSet } from '../../common/src/database/migrate.ts'
import type { PostgresNeeds } from '../../common/src/database/privileges.ts'

/** The gateway schema (API keys and their change log), applied at start under an advisory lock. */
export const GATEWAY_MIGRATIONS: MigrationSet = {
  schema: 'gateway',
  directory: path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'migrations'),
}

/**
 * What the gateway's role must be granted (the owner of what its migrations made has it all until
 * someone revokes it). Requests need the keys and the change log that carries revocations; ban
 * records, unbans and the purge write; migrations need CREATE on the database and the schema at
 * every start (CREATE … IF NOT EXISTS checks the privilege before it looks).
 */
export const GATEWAY_POSTGRES_NEEDS: PostgresNeeds = {
  who: 'gateway',
  schema: 'gateway',
  serving: [
    { on: 'database', privileges: ['CONNECT'] },
    { on: 'schema', privileges: ['USAGE'] },
    { on: 'table', table: 'api_keys', privileges: ['SELECT'] },
    { on: 'table', table: 'api_key_changes', privileges: ['SELECT'] },
  ],
  besides: [
    { on: 'database', privileges: ['CREATE'] },
    { on: 'schema', privileges: ['CREATE'] },
    { on: 'table', table: 'schema_migrations', privileges: ['SELECT', 'INSERT'] },
    { on: 'table', table: 'api_key_changes', privileges: ['INSERT', 'UPDATE', 'DELETE'] },
    { on: 'table', table: 'api_key_bans', privileges: ['SELECT', 'INSERT', 'UPDATE', 'DELETE'] },
  ],
  // 014 makes the trigger that announces a TRUNCATE of the keys table.
  migrating: [{ on: 'table', table: 'api_keys', privileges: ['TRIGGER'] }],
}

/** The keys CLI: the gateway's needs, and writing the keys themselves (a change writes the change log, through its trigger). */
export const KEYS_CLI_POSTGRES_NEEDS: PostgresNeeds = {
  ...GATEWAY_POSTGRES_NEEDS,
  who: 'keys CLI',
  besides: [...GATEWAY_POSTGRES_NEEDS.besides, { on: 'table', table: 'api_keys', privileges: ['INSERT', 'UPDATE'] }],
}
