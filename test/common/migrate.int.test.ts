import { createHash } from 'node:crypto'
import pg from 'pg'
import pino from 'pino'
import { describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { captureLog } from '../helpers/logCapture.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

describe('migrations at boot', () => {
  const database = suiteDatabase()

  it('warn, naming them, of recorded migrations with no file here or under another file\'s name', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'migrate-strangers-test' })
    const log = captureLog()
    const logger = pino(log.stream)
    try {
      await migrate(pool, PETS_MIGRATIONS, logger)
      expect(log.entries().filter((entry) => entry.level === 40)).toEqual([])
      await pool.query(`UPDATE pets.schema_migrations SET name = '001_renamed.sql' WHERE version = 1`)
      await pool.query(`INSERT INTO pets.schema_migrations (version, name) VALUES (99, '099_from_a_newer_version.sql')`)
      expect(await migrate(pool, PETS_MIGRATIONS, logger)).toEqual([])
      const warnings = log.entries().filter((entry) => entry.level === 40)
      expect(warnings).toHaveLength(1)
      expect(warnings[0]).toMatchObject({
        schema: 'pets',
        recorded: [
          { version: 1, name: '001_renamed.sql', file: '001_pets.sql' },
          { version: 99, name: '099_from_a_newer_version.sql', file: null },
        ],
      })
    } finally {
      await pool.query('DROP SCHEMA pets CASCADE').catch(() => undefined)
      await pool.end()
    }
  })

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
