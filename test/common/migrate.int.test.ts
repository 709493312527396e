import { createHash } from 'node:crypto'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

describe('migrations at boot', () => {
  const database = suiteDatabase()

  // The request pool bounds statements at 5 s; a second replica waits for the first's migrations
  // as long as they take (here 6.5 s), then finds nothing left to apply.
  it('wait for another instance migrating for longer than a request may take', async () => {
    const holder = new pg.Client({ connectionString: database.url })
    await holder.connect()
    const lock = createHash('sha256').update(`migrations:${GATEWAY_MIGRATIONS.schema}`).digest().readBigInt64BE(0)
    await holder.query('SELECT pg_advisory_lock($1::bigint)', [lock.toString()])
    setTimeout(() => void holder.query('SELECT pg_advisory_unlock($1::bigint)', [lock.toString()]), 6_500)
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-wait-test' })
    try {
      expect(await migrate(pool, GATEWAY_MIGRATIONS)).not.toHaveLength(0)
    } finally {
      await holder.end()
      await pool.end()
    }
  }, 20_000)

  it('fail with an error, not a crash, when the connection is lost while waiting for the lock', async () => {
    // Another instance holds the schema's migration lock, so this one waits on it.
    const holder = new pg.Client({ connectionString: database.url })
    await holder.connect()
    const lock = createHash('sha256').update(`migrations:${PETS_MIGRATIONS.schema}`).digest().readBigInt64BE(0)
    await holder.query('SELECT pg_advisory_lock($1::bigint)', [lock.toString()])

    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const viaRelay = new URL(database.url)
    viaRelay.port = String(relay.port)
    const pool = createPool({ connectionString: viaRelay.toString(), applicationName: 'migrate-test' })
    pool.on('error', () => undefined)
    try {
      const migrating = migrate(pool, PETS_MIGRATIONS)
      const outcome = migrating.then(
        () => 'migrated',
        (error: unknown) => (error instanceof Error ? error.message : String(error)),
      )
      await new Promise((resolve) => setTimeout(resolve, 500))
      await relay.cut()
      expect(await outcome).not.toBe('migrated')
      // Nothing was applied, and the next attempt, with the path back, applies everything.
      await holder.query('SELECT pg_advisory_unlock($1::bigint)', [lock.toString()])
      await relay.restore()
      expect(await migrate(pool, PETS_MIGRATIONS)).not.toHaveLength(0)
    } finally {
      await holder.end()
      await pool.end()
      await relay.close()
    }
  })
})
