import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository, type KeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

// A day's change log after a bulk change of keys: updates, and an unban in thirty entries.
const ENTRIES = 300_000
const KEYS = 20_000
// Keys with a ban recorded: enough that a ban record is looked up by its key rather than read with the rest.
const BANS = 2_000

interface PlanNode {
  'Node Type': string
  'Relation Name'?: string
  'Actual Rows': number
  'Actual Loops': number
  'Rows Removed by Filter'?: number
  'Rows Removed by Index Recheck'?: number
  Plans?: PlanNode[]
}

/** Each scan of `table` in the plan: its kind, and the rows it read (returned plus thrown away). */
function scansOf(node: PlanNode, table: string): { type: string; read: number }[] {
  const own =
    node['Relation Name'] === table && /Scan/.test(node['Node Type'])
      ? [{ type: node['Node Type'], read: (node['Actual Rows'] + (node['Rows Removed by Filter'] ?? 0)) * node['Actual Loops'] }]
      : []
  return [...own, ...(node.Plans ?? []).flatMap((child) => scansOf(child, table))]
}

describe('the gateway key tables at a production size', () => {
  const database = suiteDatabase()
  let pool: pg.Pool
  let admin: pg.Client
  let repository: KeyRepository

  beforeAll(async () => {
    pool = createPool({ connectionString: database.url, applicationName: 'key-tables-at-scale', max: 2 })
    await migrate(pool, GATEWAY_MIGRATIONS)
    repository = createKeyRepository(pool)
    admin = new pg.Client({ connectionString: database.url })
    await admin.connect()
    await admin.query(
      `INSERT INTO gateway.api_key_changes (key_id, key_hash, kind, changed_at, applied_at)
       SELECT 'key_bulk' || (g % ${KEYS}), sha256(g::text::bytea), CASE WHEN g % 30 = 0 THEN 'unban' ELSE 'updated' END,
              now() - interval '20 hours', CASE WHEN g % 30 = 0 THEN now() - interval '20 hours' END
         FROM generate_series(1, ${ENTRIES}) g`,
    )
    await admin.query('VACUUM ANALYZE gateway.api_key_changes')
  }, 120_000)
  afterAll(async () => {
    await admin?.end()
    await pool?.end()
  })

  /** EXPLAIN ANALYZE of the statement `act` sent that `matches`, run again in a transaction rolled back. */
  async function planOf(act: () => Promise<unknown>, matches: (text: string) => boolean): Promise<PlanNode> {
    const query = vi.spyOn(pg.Client.prototype, 'query')
    let sent: unknown[][]
    try {
      await act()
    } finally {
      sent = [...query.mock.calls]
      query.mockRestore()
    }
    const [text, values] = sent.find(([statement]) => typeof statement === 'string' && matches(statement)) as [string, unknown[]]
    await admin.query('BEGIN')
    try {
      const { rows } = await admin.query({ text: `EXPLAIN (ANALYZE, FORMAT JSON) ${text}`, values })
      return (rows[0]['QUERY PLAN'] as [{ Plan: PlanNode }])[0].Plan
    } finally {
      await admin.query('ROLLBACK')
    }
  }

  // Found at 3 M entries: each such write read the whole change log (245 ms), one per ban of a
  // burst, on a connection of the pool the key lookups of requests wait for.
  it('records a late ban by reading the unbans of its key alone, not the whole change log', async () => {
    const { record } = await repository.create({ name: 'banned late', plan: 'free' })
    const now = Date.now()
    const ban = { keyId: record.id, step: 0, startedAt: new Date(now), endsAt: new Date(now + 60_000) }
    const plan = await planOf(
      async () => expect(await repository.recordBan(ban, performance.now(), true)).toBe('recorded'),
      (text) => text.includes('INSERT INTO gateway.api_key_bans'),
    )
    const scans = scansOf(plan, 'api_key_changes')
    expect(scans).not.toEqual([])
    expect(scans.filter((scan) => scan.type === 'Seq Scan')).toEqual([])
    expect(scans.reduce((sum, scan) => sum + scan.read, 0)).toBeLessThan(100)
    expect((await repository.activeBans([record.id])).get(record.id)).toMatchObject({ step: 0 })
  })

  // Found at 100,000 ban records and 3 M entries: the planner took every 'updated' entry for a
  // pending unban too (their applied_at is NULL as well), and read every ban record to check a few
  // unbans, every 2 s on every gateway while one is pending (as through an outage of the store).
  it('checks the pending unbans for a newer ban by looking up their keys alone, not every ban record', async () => {
    await admin.query(
      `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
       SELECT 'key_banned' || g, sha256(('banned' || g)::bytea), 'aas_banned', 'banned', 'free' FROM generate_series(1, ${BANS}) g`,
    )
    await admin.query(
      `INSERT INTO gateway.api_key_bans (key_id, step, started_at, ends_at, recorded_at)
       SELECT 'key_banned' || g, 0, now() - interval '3 hours', now() + interval '1 hour',
              CASE WHEN g = 1 THEN now() - interval '30 minutes' ELSE now() - interval '3 hours' END
         FROM generate_series(1, ${BANS}) g`,
    )
    // Both asked for an hour ago, while no gateway could apply them: the first key was banned again since.
    const { rows: unbans } = await admin.query<{ id: number }>(
      `INSERT INTO gateway.api_key_changes (key_id, key_hash, kind, changed_at)
       SELECT id, key_hash, 'unban', now() - interval '1 hour' FROM gateway.api_keys WHERE id IN ('key_banned1', 'key_banned2')
       ORDER BY id RETURNING id::int`,
    )
    await admin.query('ANALYZE gateway.api_key_bans')
    const plan = await planOf(
      async () => expect((await repository.pendingUnbans()).map((change) => change.keyId)).toEqual(['key_banned2']),
      (text) => text.includes('UPDATE gateway.api_key_changes c SET applied_at'),
    )
    const scans = scansOf(plan, 'api_key_bans')
    expect(scans).not.toEqual([])
    expect(scans.filter((scan) => scan.type === 'Seq Scan')).toEqual([])
    expect(scans.reduce((sum, scan) => sum + scan.read, 0)).toBeLessThan(100)
    expect(await Promise.all(unbans.map((unban) => repository.isUnbanApplied(unban.id)))).toEqual([true, false])
  })
})
