import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type { MigrationSet } from '../../common/src/database/migrate.ts'

/** The pets schema's numbered SQL migrations, applied at start under an advisory lock. */
export const PETS_MIGRATIONS: MigrationSet = {
  schema: 'pets',
  directory: path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'migrations'),
}
