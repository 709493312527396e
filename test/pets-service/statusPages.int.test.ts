import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startPetsService, type RunningPetsService } from '../helpers/petsService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

// An adoption store's catalogue: the old pets were adopted long ago, the recent ones wait for a home.
const SOLD = 240_000
const TOTAL = 300_000

interface PlanNode {
  'Actual Rows': number
  'Rows Removed by Filter'?: number
  Plans?: PlanNode[]
}
/** Rows a plan read: what each leaf returned plus what every filter threw away. */
const rowsRead = (node: PlanNode): number =>
  (node['Rows Removed by Filter'] ?? 0) + (node.Plans ? node.Plans.reduce((sum, child) => sum + rowsRead(child), 0) : node['Actual Rows'])

describe('status-filtered pages in a catalogue whose statuses cluster by id', () => {
  const database = suiteDatabase()
  let service: RunningPetsService
  let admin: pg.Client

  beforeAll(async () => {
    service = await startPetsService(database.url)
    admin = new pg.Client({ connectionString: database.url })
    await admin.connect()
    await admin.query(
      `INSERT INTO pets.pets (name, category_id, status)
       SELECT 'Pet ' || g, 1 + g % 50, CASE WHEN g <= ${SOLD} THEN 'sold' ELSE 'available' END FROM generate_series(1, ${TOTAL}) g`,
    )
    await admin.query('VACUUM ANALYZE pets.pets')
  }, 120_000)
  afterAll(async () => {
    await admin?.end()
    await service?.close()
  })

  /** GET `path` from the real service, then EXPLAIN ANALYZE the very statement its repository sent for it. */
  async function serve(path: string) {
    const sent: pg.QueryConfig[] = []
    const query = service.pool.query.bind(service.pool)
    service.pool.query = ((config: pg.QueryConfig, ...rest: unknown[]) => {
      sent.push(config)
      return (query as (...args: unknown[]) => unknown)(config, ...rest)
    }) as typeof service.pool.query
    const response = await service.request(path)
    service.pool.query = query
    const body = (await response.json()) as unknown[]
    const statement = sent.at(-1)!
    const { rows } = await admin.query({ text: `EXPLAIN (ANALYZE, FORMAT JSON) ${statement.text}`, values: statement.values })
    const plan = (rows[0]['QUERY PLAN'] as [{ Plan: PlanNode }])[0].Plan
    const next = /<([^>]+)>; rel="next"/.exec(response.headers.get('link') ?? '')?.[1]
    return { status: response.status, rows: body.length, next, read: rowsRead(plan) }
  }
  const cursor = (id: number) => Buffer.from(`p1:${id}`).toString('base64url')

  // Read as "status = $1 AND id > $2 ORDER BY id", the last page of this walk read the 60,000 later
  // pets of another status; at 3 M pets, 600,000 rows, and a few clients drained the pool.
  it('reads only its own rows on the last page of a walk the API itself leads', async () => {
    const secondToLast = await serve(`/pets?status=sold&limit=100&cursor=${cursor(SOLD - 200)}`)
    expect(secondToLast.next).toBe(`/pets?limit=100&status=sold&cursor=${cursor(SOLD - 100)}`)
    const last = await serve(secondToLast.next!.replace(/^\/v1/, ''))
    expect(last).toMatchObject({ status: 200, rows: 100, next: undefined })
    expect(last.read).toBeLessThanOrEqual(101)
  })

  it('reads only its own rows after a cursor anyone can write', async () => {
    const page = await serve(`/pets?status=available&limit=20&cursor=${cursor(100_000)}`)
    expect(page).toMatchObject({ status: 200, rows: 20 })
    expect(page.read).toBeLessThanOrEqual(21)
  })
})
