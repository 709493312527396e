import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type { MigrationSet } from '../../common/src/database/migrate.ts'

/** The gateway schema (API keys and their change log), applied at start under an advisory lock. */
export const GATEWAY_MIGRATIONS: MigrationSet = {
  schema: 'gateway',
  directory: path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'migrations'),
}
