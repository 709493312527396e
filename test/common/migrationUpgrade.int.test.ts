import { copyFile, mkdtemp, readFile, readdir, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import { migrate, type MigrationSet } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { PETS_MIGRATIONS } from '../../pets-service/src/migrations.ts'
import { freshDatabase } from '../helpers/testDatabase.ts'

// The files that numbers 009 and 010 named between b9ac498 and b3fe5e3, before the renumbering.
const RENUMBERED = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'fixtures', 'migrations', 'gateway-renumbered')

/** What a schema holds, as the catalog describes it: equal for two databases with the same schema. */
async function schemaOf(url: string, schema: string): Promise<Record<string, unknown[]>> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const read = async (sql: string) => (await client.query({ text: sql, values: [schema], rowMode: 'array' })).rows
    return {
      columns: await read(
        `SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns
          WHERE table_schema = $1 ORDER BY 1, 2`,
      ),
      indexes: await read('SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1'),
      constraints: await read(
        `SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
          WHERE connamespace = $1::regnamespace ORDER BY 1, 2`,
      ),
      triggers: await read(
        `SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE NOT tgisinternal AND c.relnamespace = $1::regnamespace ORDER BY 1, 2`,
      ),
      functions: await read('SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = $1::regnamespace ORDER BY 1'),
      sequences: await read('SELECT sequencename, max_value::text FROM pg_sequences WHERE schemaname = $1 ORDER BY 1'),
      migrations: (await client.query({ text: `SELECT version, name FROM "${schema}".schema_migrations ORDER BY 1`, rowMode: 'array' })).rows,
    }
  } finally {
    await client.end()
  }
}

/** Migrates a new database with the files `seed` names (as an older version had them), then with the current ones. */
async function upgradedSchema(set: MigrationSet, seed: string[]): Promise<Record<string, unknown[]>> {
  const database = await freshDatabase()
  const folder = await mkdtemp(path.join(tmpdir(), 'aas-migrations-'))
  const pool = createPool({ connectionString: database.url, applicationName: 'migration-upgrade-test' })
  try {
    for (const file of seed) await copyFile(file, path.join(folder, path.basename(file)))
    await migrate(pool, { schema: set.schema, directory: folder })
    await migrate(pool, set)
    return await schemaOf(database.url, set.schema)
  } finally {
    await pool.end()
    await rm(folder, { recursive: true, force: true })
    await database.drop()
  }
}

async function freshSchema(set: MigrationSet): Promise<Record<string, unknown[]>> {
  return upgradedSchema(set, [])
}

async function currentFiles(set: MigrationSet): Promise<string[]> {
  return (await readdir(set.directory))
    .filter((file) => file.endsWith('.sql'))
    .sort()
    .map((file) => path.join(set.directory, file))
}

describe('a database migrated by an older version', () => {
  for (const set of [GATEWAY_MIGRATIONS, PETS_MIGRATIONS]) {
    it(`ends, after the current migrations, with the ${set.schema} schema of a new database, whichever migration it stopped at`, async () => {
      const files = await currentFiles(set)
      const fresh = await freshSchema(set)
      for (let applied = 1; applied < files.length; applied++) {
        expect(await upgradedSchema(set, files.slice(0, applied)), `stopped after ${path.basename(files[applied - 1] ?? '')}`).toEqual(fresh)
      }
    }, 60_000)
  }

  // Numbers 009 and 010 named other files before b3fe5e3. The migrator goes by number, so a
  // database migrated then was taken to have the current 009 (the keys listing index) or 010
  // (the change log's id bound) and never got it, and kept an index nothing uses any more.
  it('ends with the gateway schema of a new database when its 009 and 010 were the files of before the renumbering', async () => {
    const files = await currentFiles(GATEWAY_MIGRATIONS)
    const upTo008 = files.filter((file) => Number(path.basename(file).slice(0, 3)) <= 8)
    const fresh = await freshSchema(GATEWAY_MIGRATIONS)
    // b9ac498: 009 was the changed_at index; d9634ba to 4b47ac6: and 010 the listing index.
    expect(await upgradedSchema(GATEWAY_MIGRATIONS, [...upTo008, path.join(RENUMBERED, '009_change_log_changed_at_index.sql')])).toEqual(fresh)
    expect(
      await upgradedSchema(GATEWAY_MIGRATIONS, [
        ...upTo008,
        path.join(RENUMBERED, '009_change_log_changed_at_index.sql'),
        path.join(RENUMBERED, '010_api_keys_listing_index.sql'),
      ]),
    ).toEqual(fresh)
  }, 60_000)

  // A rolling deploy runs 011 on databases that need nothing from it: it must then take no lock
  // on the key tables, or it waits behind (and holds up) any open use of them.
  it('runs 011 on an up-to-date gateway schema without locking the key tables', async () => {
    const database = await freshDatabase()
    const pool = createPool({ connectionString: database.url, applicationName: 'migration-011-locks-test' })
    const client = new pg.Client({ connectionString: database.url })
    try {
      await migrate(pool, GATEWAY_MIGRATIONS)
      await client.connect()
      await client.query('BEGIN')
      await client.query(await readFile(path.join(GATEWAY_MIGRATIONS.directory, '011_renumbered_migrations.sql'), 'utf8'))
      const { rows } = await client.query<{ relation: string }>(
        `SELECT relation::regclass::text AS relation FROM pg_locks
          WHERE pid = pg_backend_pid() AND locktype = 'relation' AND relation::regclass::text LIKE 'gateway.api_key%'`,
      )
      expect(rows).toEqual([])
      await client.query('ROLLBACK')
    } finally {
      await client.end()
      await pool.end()
      await database.drop()
    }
  })
})
