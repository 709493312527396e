import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'

/**
 * The embedded default's first start issues one Free-plan key so a new user can call the API
 * at once. Only the first: the plaintext is never stored, so it cannot be shown again.
 */
export async function issueDemoKeyOnFirstStart(databaseUrl: string): Promise<string | undefined> {
  const pool = createPool({ connectionString: databaseUrl, applicationName: 'npm-start', max: 1 })
  try {
    await migrate(pool, GATEWAY_MIGRATIONS)
    const keys = createKeyRepository(pool)
    if ((await keys.count()) > 0) return undefined
    const { key } = await keys.create({ name: 'demo', plan: 'free' })
    return key
  } finally {
    await pool.end()
  }
}
