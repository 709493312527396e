import type pg from 'pg'
import { deleteInBatches } from '../../../common/src/database/hourlyPurge.ts'
import { withConnection } from '../../../common/src/database/pool.ts'
import type { Pet, PetStatus } from '../schemas/pet.ts'

export interface NewPetRow {
  name: string
  categoryId: number
  status: PetStatus
}

export interface PageQuery {
  limit: number
  status?: PetStatus
  afterId: number
}

export interface IdempotencyClaim {
  consumer: string
  key: string
  /** Hash of the normalised request body; a different body under the same key is refused. */
  fingerprint: string
}

export type CreateResult =
  | { outcome: 'created'; pet: Pet }
  | { outcome: 'replayed'; pet: Pet }
  | { outcome: 'key_reused' }

const COLUMNS = 'id, name, category_id AS "categoryId", status'

// The read queries run as named prepared statements where every connection is its own session
// (see connectionsHaveOwnSessions): each pooled connection parses and plans them once, and every
// later call only binds and executes, which saves Postgres CPU per request.
const LIST_PAGE = `SELECT ${COLUMNS} FROM pets.pets WHERE id > $1 ORDER BY id LIMIT $2`
// A range of the (status, id) index, not "status = $1 AND id > $2 ORDER BY id": with that form the
// planner may walk the primary key and filter on status, and where statuses cluster by id (the old
// pets adopted, the new ones available) a page read every later pet of another status: 600,000
// rows for a walk's last page at 3 M pets, enough for a few clients to drain the pool.
const LIST_PAGE_BY_STATUS = `SELECT ${COLUMNS} FROM pets.pets
  WHERE (status, id) > ($1, $2) AND (status, id) <= ($1, 9007199254740991) ORDER BY status, id LIMIT $3`
const FIND_BY_ID = `SELECT ${COLUMNS} FROM pets.pets WHERE id = $1`

/** How long an Idempotency-Key is remembered. */
export const IDEMPOTENCY_RETENTION_HOURS = 24
/** Rows one purge statement deletes: a few milliseconds of work, well inside the statement timeout. */
const IDEMPOTENCY_PURGE_BATCH_ROWS = 5_000
/** Postgres's feature_not_supported, with which it refuses a prepared statement whose result type has changed. */
const FEATURE_NOT_SUPPORTED = '0A000'

export interface PetRepositoryOptions {
  /** Name the read queries so each connection prepares them once. Default true. */
  preparedStatements?: boolean
}

export function createPetRepository(pool: pg.Pool, options: PetRepositoryOptions = {}) {
  const named = options.preparedStatements ?? true
  /**
   * A named statement's result type is fixed when a connection prepares it: once a column it
   * returns changes type (a migration, from another version's rolling deploy), Postgres refuses it
   * on every connection that prepared it ("cached plan must not change result type"), a 500 each.
   * The pool closes that connection, and the statement runs again unnamed, planned afresh.
   */
  const read = async <R extends pg.QueryResultRow>(name: string, text: string, values: unknown[]): Promise<pg.QueryResult<R>> => {
    if (!named) return pool.query<R>({ text, values })
    try {
      return await pool.query<R>({ name, text, values })
    } catch (error) {
      if ((error as { code?: unknown }).code !== FEATURE_NOT_SUPPORTED) throw error
      return pool.query<R>({ text, values })
    }
  }

  async function insertPet(client: pg.Pool | pg.PoolClient, pet: NewPetRow): Promise<Pet> {
    const { rows } = await client.query<Pet>(
      `INSERT INTO pets.pets (name, category_id, status) VALUES ($1, $2, $3) RETURNING ${COLUMNS}`,
      [pet.name, pet.categoryId, pet.status],
    )
    return rows[0] as Pet
  }

  return {
    /** One page in id order; asks for `limit` rows and the caller decides on a next link. */
    async listPage({ limit, status, afterId }: PageQuery): Promise<Pet[]> {
      const { rows } =
        status === undefined
          ? await read<Pet>('pets.list-page', LIST_PAGE, [afterId, limit])
          : await read<Pet>('pets.list-page-by-status', LIST_PAGE_BY_STATUS, [status, afterId, limit])
      return rows
    },

    async findById(id: number): Promise<Pet | undefined> {
      const { rows } = await read<Pet>('pets.find-by-id', FIND_BY_ID, [id])
      return rows[0]
    },

    async create(pet: NewPetRow, claim?: IdempotencyClaim): Promise<CreateResult> {
      if (!claim) return { outcome: 'created', pet: await insertPet(pool, pet) }
      // withConnection hears a connection lost mid-transaction (unheard, its 'error' event stopped
      // the service), and closes the connection of a transaction that failed instead of returning
      // it: a session opened while the database took no writes (default_transaction_read_only)
      // stays read-only after it takes them again, and would fail every later create with a key.
      // Closed, its transaction is rolled back by Postgres.
      return withConnection(pool, async (client) => {
        // Whatever the database's default: the claim below relies on READ COMMITTED, where a claim
        // that waited sees the row the first committed. Under REPEATABLE READ or SERIALIZABLE (set
        // for a database or role) the retries that waited failed with 40001 instead.
        await client.query('BEGIN ISOLATION LEVEL READ COMMITTED')
        // A concurrent request with the same key blocks here until the first commits, then
        // finds its row: exactly one pet per key whatever the interleaving. A row past the
        // retention is claimed afresh (the hourly purge may not have run, say on a service
        // restarted more often), and one within it is locked, whether updated or not, so a purge
        // cannot delete it between this claim and the replay that reads it.
        const claimed = await client.query(
          `INSERT INTO pets.idempotency_keys (consumer, key, fingerprint) VALUES ($1, $2, $3)
           ON CONFLICT (consumer, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, pet_id = NULL, created_at = now()
             WHERE pets.idempotency_keys.created_at < now() - make_interval(hours => $4)`,
          [claim.consumer, claim.key, claim.fingerprint, IDEMPOTENCY_RETENTION_HOURS],
        )
        let result: CreateResult
        if (claimed.rowCount === 1) {
          const created = await insertPet(client, pet)
          await client.query('UPDATE pets.idempotency_keys SET pet_id = $3 WHERE consumer = $1 AND key = $2', [
            claim.consumer,
            claim.key,
            created.id,
          ])
          result = { outcome: 'created', pet: created }
        } else {
          result = await replay(client, claim)
        }
        await client.query('COMMIT')
        return result
      })
    },

    /**
     * Forgets idempotency keys older than the retention period; returns how many. In batches,
     * each its own statement: one DELETE of a backlog too big for the statement timeout would be
     * rolled back whole, every hour, while the backlog only grew. Rows a claim holds are skipped
     * (the claim renews them), as are those another replica's purge holds. A batch that the
     * statement timeout cancels (a loaded or slow database) is rolled back and tried again at half
     * the size (deleteInBatches).
     */
    async purgeIdempotencyKeys(batchRows = IDEMPOTENCY_PURGE_BATCH_ROWS): Promise<number> {
      // Each batch starts where the last one ended: while another session's snapshot (a pg_dump, a
      // report) keeps the deleted rows' index entries from being pruned, a batch from the oldest
      // would step over all of them again, and the run would slow down batch by batch.
      // A Date keeps milliseconds only: cut down, it still starts at or before the last row deleted.
      let from: Date | string = '-infinity'
      return deleteInBatches(batchRows, async (rows) => {
        const { rows: [batch] } = await pool.query<{ deleted: number; last: Date | null }>(
          // Oldest first, through the created_at index.
          `WITH deleted AS (
             DELETE FROM pets.idempotency_keys WHERE ctid = ANY(ARRAY(
               SELECT ctid FROM pets.idempotency_keys
                WHERE created_at < now() - make_interval(hours => $1) AND created_at >= $3::timestamptz
                ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))
             RETURNING created_at)
           SELECT count(*)::int AS deleted, max(created_at) AS last FROM deleted`,
          [IDEMPOTENCY_RETENTION_HOURS, rows, from],
        )
        from = batch?.last ?? from
        return batch?.deleted ?? 0
      })
    },

    async ping(): Promise<void> {
      await pool.query('SELECT 1')
    },
  }
}

async function replay(client: pg.PoolClient, claim: IdempotencyClaim): Promise<CreateResult> {
  const { rows } = await client.query<Pet & { fingerprint: string }>(
    `SELECT k.fingerprint, p.id, p.name, p.category_id AS "categoryId", p.status
       FROM pets.idempotency_keys k JOIN pets.pets p ON p.id = k.pet_id
      WHERE k.consumer = $1 AND k.key = $2`,
    [claim.consumer, claim.key],
  )
  const row = rows[0]
  if (!row || row.fingerprint !== claim.fingerprint) return { outcome: 'key_reused' }
  const { fingerprint: _fingerprint, ...pet } = row
  return { outcome: 'replayed', pet }
}

export type PetRepository = ReturnType<typeof createPetRepository>
