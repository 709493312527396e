import type pg from 'pg'
import { deleteInBatches } from '../../../common/src/database/hourlyPurge.ts'
import { isQueryCanceled, withConnection } from '../../../common/src/database/pool.ts'
import { displayPrefix, generateApiKey, generateKeyId, hashApiKey } from './apiKeyFormat.ts'

export interface ApiKeyRecord {
  id: string
  displayPrefix: string
  name: string
  plan: string
  perMinute: number | null
  perDay: number | null
  createdAt: Date
  expiresAt: Date | null
  revokedAt: Date | null
  /**
   * On a record read for authentication (findByHash): when it expires on this process's
   * monotonic clock (performance.now()), from the time it had left by the database's clock. A
   * gateway whose wall clock is off then neither admits an expired key nor refuses a live one.
   */
  expiresAtMonotonic?: number
}

export interface KeyChange {
  id: number
  keyId: string
  keyHash: Buffer
  kind: 'updated' | 'unban'
  /**
   * An unban already lifted in the rate-limit store (by a gateway that marked it, or the
   * announcement of a late one), or overtaken by a newer ban: gateways only forget what they hold
   * themselves. Lifting it in the store again could lift a ban the key has earned since.
   */
  applied: boolean
}

/** A ban as the gateway that started it recorded it (the store holds the ban itself). */
export interface RecordedBan {
  keyId: string
  /** The ladder step, 0 for the first. */
  step: number
  startedAt: Date
  endsAt: Date
}

/**
 * A point in the change log, as a snapshot: the transactions running then (xip), the first one
 * not yet begun (xmax) and the highest id visible. What a later read has not seen yet is what was
 * invisible there.
 */
/** A change-log entry as the feed reads it. */
export type FeedEntry = KeyChange & { inFirst: boolean }

/** The snapshot to judge `inFirst` by is always parameter $3. */
const FEED_COLUMNS = `id, key_id AS "keyId", key_hash AS "keyHash", kind, applied_at IS NOT NULL AS applied,
  pg_visible_in_snapshot(xid, $3::pg_snapshot) AS "inFirst"`

export interface FeedPosition {
  xmax: string
  xip: string[]
  /** A bigint, as text. */
  maxId: string
  snapshot: string
}

/** Rows the hourly purge deletes per statement. */
const PURGE_BATCH_ROWS = 5_000

export interface NewApiKey {
  name: string
  plan: string
  perMinute?: number | null
  perDay?: number | null
  expiresAt?: Date | null
  /** Instead of expiresAt: the key expires this long after its creation, by the database's clock. */
  expiresInMillis?: number
  /** Refuse (ExpiryPassedError) an expiry not after the database's now: a key no gateway would take. */
  expiryInFuture?: boolean
}

/** create's `expiryInFuture` not met: the expiry had passed by the database's clock, and no key was made. */
export class ExpiryPassedError extends Error {}

const COLUMNS = `id, display_prefix AS "displayPrefix", name, plan, per_minute AS "perMinute",
  per_day AS "perDay", created_at AS "createdAt", expires_at AS "expiresAt", revoked_at AS "revokedAt"`

export function isUsable(record: ApiKeyRecord): boolean {
  if (record.revokedAt !== null) return false
  if (record.expiresAt === null) return true
  return record.expiresAtMonotonic === undefined ? record.expiresAt.getTime() > Date.now() : record.expiresAtMonotonic > performance.now()
}

/** SQL for the gateway schema's API keys; everything else works with ApiKeyRecord. */
/**
 * Runs one statement that only an index serves well, in its order, with sorts and bitmap scans off
 * for it alone: statistics the table has outgrown would otherwise have the planner read and sort
 * far more than the statement returns. In a transaction of its own, so the settings end with it,
 * also where connections share a session (PGlite) or a server connection (a transaction pooler);
 * a connection whose statement failed is dropped by the caller's withConnection.
 */
async function inIndexOrder<R extends pg.QueryResultRow>(client: pg.PoolClient, text: string, values: unknown[]): Promise<R[]> {
  await client.query('BEGIN')
  await client.query('SET LOCAL enable_sort = off')
  await client.query('SET LOCAL enable_bitmapscan = off')
  const { rows } = await client.query<R>(text, values)
  await client.query('COMMIT')
  return rows
}

/**
 * A key's ban record and the marking of its unbans are written one at a time, each holding the
 * key's advisory lock in its transaction. Side by side, each statement read the table the other
 * writes as it was before: the unban's delete missed a record being written, the record's check
 * missed the unban being marked, and a ban the unban had lifted stayed recorded. Not the key's
 * row: an operator's open transaction that updates gateway.api_keys holds that, and ban records
 * waiting behind it took every connection of the pool, so keys not cached got 503.
 */
const LOCK_KEY = `SELECT pg_advisory_xact_lock(hashtext('gateway.api_key_bans'), hashtext($1))`
const LOCK_KEY_OF_CHANGE = `SELECT pg_advisory_xact_lock(hashtext('gateway.api_key_bans'), hashtext(key_id))
  FROM gateway.api_key_changes WHERE id = $1`

/**
 * What became of a ban's record: written; not written because an unban applied since lifted the
 * ban, or because the record of a newer ban is there (an older ban's write, retried late, must not
 * replace it), or because the key no longer exists (deleted by hand).
 */
export type BanRecordOutcome = 'recorded' | 'lifted' | 'overtaken' | 'no key'

export function createKeyRepository(pool: pg.Pool) {
  /** One statement of the feed's reads, its connection bound by `answerWithinMillis` when given. */
  const feedQuery = <R extends pg.QueryResultRow>(answerWithinMillis: number | undefined, text: string, values?: unknown[]) =>
    withConnection(pool, (client) => client.query<R>(text, values), { answerWithinMillis })

  /** A key that can still be used, by the database's clock: what set-plan and set-limits may change. */
  const USABLE = 'revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())'

  async function updateOne(sql: string, params: unknown[]): Promise<ApiKeyRecord | undefined> {
    const { rows } = await pool.query<ApiKeyRecord>(`${sql} RETURNING ${COLUMNS}`, params)
    return rows[0]
  }

  return {
    /** Creates a key; the plaintext is returned here and nowhere else, ever. */
    async create(input: NewApiKey): Promise<{ record: ApiKeyRecord; key: string }> {
      const key = generateApiKey()
      // The expiry judged by the database's clock, the one gateways judge it by: a CLI machine's
      // clock behind it (or a second between parsing and the insert) made a key expired at birth.
      const { rows } = await pool.query<ApiKeyRecord>(
        `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan, per_minute, per_day, expires_at)
         SELECT $1, $2, $3, $4, $5, $6, $7, expiry
           FROM (SELECT COALESCE($8, now() + $9 * interval '1 millisecond') AS expiry) chosen
          WHERE NOT $10::boolean OR expiry IS NULL OR expiry > now()
         RETURNING ${COLUMNS}`,
        [
          generateKeyId(),
          hashApiKey(key),
          displayPrefix(key),
          input.name,
          input.plan,
          input.perMinute ?? null,
          input.perDay ?? null,
          input.expiresAt ?? null,
          input.expiresInMillis ?? null,
          input.expiryInFuture === true,
        ],
      )
      if (rows[0] === undefined) throw new ExpiryPassedError('the expiry has passed by the database\'s clock')
      return { record: rows[0], key }
    },

    /** The key's record, its expiry on this process's monotonic clock (by the time it has left now, by the database's clock). */
    async findByHash(hash: Buffer): Promise<ApiKeyRecord | undefined> {
      // Taken before asking: the database's now() is later, so the deadline errs early, never late.
      const asked = performance.now()
      const { rows } = await pool.query<ApiKeyRecord & { expiresInMillis: number | null }>(
        `SELECT ${COLUMNS}, (extract(epoch FROM expires_at - now()) * 1000)::float8 AS "expiresInMillis"
           FROM gateway.api_keys WHERE key_hash = $1`,
        [hash],
      )
      const row = rows[0]
      if (row === undefined) return undefined
      const { expiresInMillis, ...record } = row
      return expiresInMillis === null ? record : { ...record, expiresAtMonotonic: asked + expiresInMillis }
    },

    async findById(id: string): Promise<ApiKeyRecord | undefined> {
      const { rows } = await pool.query<ApiKeyRecord>(`SELECT ${COLUMNS} FROM gateway.api_keys WHERE id = $1`, [id])
      return rows[0]
    },

    /**
     * Every key in creation order, a page per statement (each under the pool's timeout, however
     * many keys there are), walked by (created_at, id) from where the last page ended.
     */
    async *list(pageRows = 5_000): AsyncGenerator<ApiKeyRecord[]> {
      // Where the last page ended, to the microsecond (a Date keeps milliseconds only), in ISO 8601
      // UTC: the session's DateStyle and time zone could make text read back as another moment.
      let after: { at: string; id: string } | undefined
      for (;;) {
        const { rows } = await pool.query<ApiKeyRecord & { cursorAt: string }>(
          `SELECT ${COLUMNS}, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS "cursorAt" FROM gateway.api_keys
            WHERE $1::timestamptz IS NULL OR (created_at, id) > ($1::timestamptz, $2)
            ORDER BY created_at, id LIMIT $3`,
          [after?.at ?? null, after?.id ?? null, pageRows],
        )
        if (rows.length > 0) yield rows.map(({ cursorAt: _cursorAt, ...record }) => record)
        if (rows.length < pageRows) return
        after = { at: rows.at(-1)!.cursorAt, id: rows.at(-1)!.id }
      }
    },

    /** The database's clock: what a key's expiry is judged by, wherever the caller runs. */
    async now(): Promise<Date> {
      const { rows } = await pool.query<{ now: Date }>('SELECT now()')
      return rows[0]!.now
    },

    async count(): Promise<number> {
      const { rows } = await pool.query<{ count: string }>('SELECT count(*) FROM gateway.api_keys')
      return Number(rows[0]?.count ?? 0)
    },

    /**
     * Usable keys (not revoked, not expired) whose limits the config does not give, by plan: a
     * key without both limits of its own (they replace its plan's, whatever the plan) whose plan
     * is not among `defined`, or is one of `custom`.
     */
    async usableWithoutLimits(defined: string[], custom: string[]): Promise<Record<string, number>> {
      const { rows } = await pool.query<{ plan: string; count: string }>(
        `SELECT plan, count(*) FROM gateway.api_keys
          WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
            AND (per_minute IS NULL OR per_day IS NULL)
            AND (plan <> ALL($1::text[]) OR plan = ANY($2::text[]))
          GROUP BY plan ORDER BY plan`,
        [defined, custom],
      )
      return Object.fromEntries(rows.map((row) => [row.plan, Number(row.count)]))
    },

    revoke: (id: string) =>
      updateOne(
        `UPDATE gateway.api_keys SET revoked_at = COALESCE(revoked_at, now()), updated_at = now() WHERE id = $1`,
        [id],
      ),

    /**
     * Moves a usable key (not revoked, not expired by the database's clock) to `plan`, with
     * `limits` set in the same statement when given; `needsLimits` (a plan with none of its own)
     * holds it to keys that will have both. Undefined when no such key was changed: the guards are
     * in the statement, so a revoke or a `set-limits --clear` committed meanwhile is seen, where a
     * check before it let a revoked key be moved, or an enterprise key be left without limits.
     */
    setPlan: (id: string, plan: string, options: { limits?: { perMinute: number; perDay: number }; needsLimits?: boolean } = {}) =>
      updateOne(
        `UPDATE gateway.api_keys
            SET plan = $2, per_minute = COALESCE($3, per_minute), per_day = COALESCE($4, per_day), updated_at = now()
          WHERE id = $1 AND ${USABLE}
            AND (NOT $5::boolean OR (COALESCE($3, per_minute) IS NOT NULL AND COALESCE($4, per_day) IS NOT NULL))`,
        [id, plan, options.limits?.perMinute ?? null, options.limits?.perDay ?? null, options.needsLimits === true],
      ),

    /**
     * Sets or clears (null) a usable key's own limits; never clears those of a key on one of
     * `plansNeedingLimits`. Undefined when no such key was changed (guards as setPlan's).
     */
    setLimits: (id: string, perMinute: number | null, perDay: number | null, plansNeedingLimits: string[] = []) =>
      updateOne(
        `UPDATE gateway.api_keys SET per_minute = $2, per_day = $3, updated_at = now()
          WHERE id = $1 AND ${USABLE} AND ($2::integer IS NOT NULL OR plan <> ALL($4::text[]))`,
        [id, perMinute, perDay, plansNeedingLimits],
      ),

    /**
     * Where the change log stands now, for the feed: what is visible, what is still running. This
     * and the feed's other reads take `answerWithinMillis`, a tighter client-side bound than the
     * pool's (withConnection).
     */
    async changeLogPosition(answerWithinMillis?: number): Promise<FeedPosition> {
      const { rows } = await feedQuery<FeedPosition>(
        answerWithinMillis,
        `SELECT pg_snapshot_xmax(s.now)::text AS xmax, ARRAY(SELECT x::text FROM pg_snapshot_xip(s.now) x) AS xip,
                (SELECT COALESCE(max(id), 0) FROM gateway.api_key_changes)::text AS "maxId", s.now::text AS snapshot
           FROM (SELECT pg_current_snapshot() AS now) s`,
      )
      return rows[0]!
    },

    /**
     * Entries with ids above `afterId`, in id order, at most `limit`. `inFirst`: the entry was
     * visible in `snapshot` (a position taken before the read began). Only entries this server's
     * transactions wrote: ones carried over from another server (a dump restored here) bear
     * transaction ids this one has not reached, and are history.
     */
    async changesById(afterId: number | string, limit: number, snapshot: string, answerWithinMillis?: number): Promise<FeedEntry[]> {
      const { rows } = await feedQuery<FeedEntry>(
        answerWithinMillis,
        `SELECT ${FEED_COLUMNS} FROM gateway.api_key_changes
          WHERE id > $1 AND xid < pg_snapshot_xmax(pg_current_snapshot())
          ORDER BY id LIMIT $2`,
        // $3 is the snapshot, as FEED_COLUMNS has it.
        [afterId, limit, snapshot],
      )
      return rows
    },

    /**
     * Entries with ids up to `upTo` of the transactions from `fromXid` to `toXid` (or on, when
     * none), in (xid, id) order after `after`, at most `limit`: the (xid, id) index serves exactly
     * these rows, one big transaction page by page.
     */
    async changesByXid(
      page: { fromXid: string; toXid?: string; upTo: number | string; after: { xid: string; id: number | string }; limit: number },
      snapshot: string,
      answerWithinMillis?: number,
    ): Promise<(FeedEntry & { xid: string })[]> {
      // Only the (xid, id) index returns these rows in order, a page at a time. Without statistics
      // (a table autovacuum has not analysed yet: a quiet gateway's, or a minute after a bulk
      // commit) the planner would rather fetch every entry of the transaction and sort them, on
      // every page.
      return withConnection(pool, (client) =>
        inIndexOrder<FeedEntry & { xid: string }>(
          client,
          `SELECT ${FEED_COLUMNS}, xid::text AS xid FROM gateway.api_key_changes
            WHERE (xid, id) > ($1::xid8, $2::bigint) AND xid >= $4::xid8 AND ($5::xid8 IS NULL OR xid <= $5::xid8) AND id <= $6
              AND xid < pg_snapshot_xmax(pg_current_snapshot())
            ORDER BY api_key_changes.xid, api_key_changes.id LIMIT $7`,
          // $3 is the snapshot, as FEED_COLUMNS has it.
          [page.after.xid, page.after.id, snapshot, page.fromXid, page.toXid ?? null, page.upTo, page.limit],
        ),
        { answerWithinMillis },
      )
    },

    /** Which of `xids` (transactions running at an earlier position) have entries visible now with ids up to `upTo`. */
    async committedAmong(xids: string[], upTo: number | string, answerWithinMillis?: number): Promise<string[]> {
      if (xids.length === 0) return []
      // From the transactions' status first: a committed one stops at its first entry, and one
      // still running (a million entries in an operator's open transaction) is not walked at all.
      // One this server has not reached (a failover to a copy that is behind) is not committed
      // here; pg_xact_status would refuse it, and every later read with it.
      const { rows } = await feedQuery<{ xid: string }>(
        answerWithinMillis,
        `SELECT x::text AS xid FROM unnest($1::xid8[]) x
          WHERE CASE WHEN x < pg_snapshot_xmax(pg_current_snapshot()) THEN pg_xact_status(x) END = 'committed'
            AND EXISTS (SELECT 1 FROM gateway.api_key_changes c WHERE c.xid = x AND c.id <= $2)
          ORDER BY x`,
        [xids, upTo],
      )
      return rows.map((row) => row.xid)
    },

    /** The log's entries after `id`, oldest first, at most 1,000 (what `keys` changed, for its tests). */
    async changesSince(id: number): Promise<KeyChange[]> {
      const { rows } = await pool.query<KeyChange>(
        `SELECT id, key_id AS "keyId", key_hash AS "keyHash", kind, applied_at IS NOT NULL AS applied
           FROM gateway.api_key_changes WHERE id > $1 ORDER BY id LIMIT 1000`,
        [id],
      )
      return rows
    },

    /**
     * Records a ban the store has just started, for `keys show` and `keys list`. `startedHere`
     * is when it started on this process's monotonic clock: its recorded_at is Postgres's time
     * less what has passed since, a wait for a connection included, so an unban asked for in the
     * meantime still comes after the ban it was meant to lift (pendingUnbans). A record written
     * `late` (a retry while Postgres was away, a write that waited for the gateway's others, or a
     * ban announced on a store reply that came after the budget, `startedHere` then its call's
     * moment) is not written once an unban asked for after the ban began has been applied: that
     * unban lifted it, and found no record to delete. A key's record is of its newest ban, by
     * recorded_at (Postgres's clock, as unbans are ordered): a write of an older ban leaves it. A
     * retry of a write that committed unseen finds its own ban recorded, by a recorded_at that
     * latency may have put later than its own: that is 'recorded'. Resolves with what became of
     * the record.
     */
    async recordBan(ban: RecordedBan, startedHere = performance.now(), late = false): Promise<BanRecordOutcome> {
      return withConnection(pool, async (client) => {
        // READ COMMITTED whatever the database's default: what the lock waited for is read after it.
        await client.query('BEGIN ISOLATION LEVEL READ COMMITTED')
        await client.query(LOCK_KEY, [ban.keyId])
        const { rows } = await client.query<{ outcome: BanRecordOutcome }>(
          `WITH ban AS (SELECT statement_timestamp() - $5 * interval '1 millisecond' AS recorded_at),
           lifted AS (
             SELECT $6::boolean AND EXISTS (
               SELECT 1 FROM gateway.api_key_changes c, ban
                WHERE c.key_id = $1 AND c.kind = 'unban' AND c.applied_at IS NOT NULL AND c.changed_at >= ban.recorded_at) AS lifted
           ), written AS (
             INSERT INTO gateway.api_key_bans (key_id, step, started_at, ends_at, recorded_at)
             SELECT k.id, $2::smallint, $3::timestamptz, $4::timestamptz, ban.recorded_at FROM gateway.api_keys k, ban, lifted
              WHERE k.id = $1 AND NOT lifted.lifted
             ON CONFLICT (key_id) DO UPDATE
               SET step = EXCLUDED.step, started_at = EXCLUDED.started_at, ends_at = EXCLUDED.ends_at, recorded_at = EXCLUDED.recorded_at
               WHERE api_key_bans.recorded_at <= EXCLUDED.recorded_at
             RETURNING 1
           )
           SELECT CASE WHEN EXISTS (SELECT 1 FROM written) THEN 'recorded'
                       WHEN EXISTS (SELECT 1 FROM gateway.api_key_bans
                                     WHERE key_id = $1 AND step = $2 AND started_at = $3 AND ends_at = $4) THEN 'recorded'
                       WHEN (SELECT lifted FROM lifted) THEN 'lifted'
                       WHEN EXISTS (SELECT 1 FROM gateway.api_keys WHERE id = $1) THEN 'overtaken'
                       ELSE 'no key' END AS outcome`,
          [ban.keyId, ban.step, ban.startedAt, ban.endsAt, Math.max(performance.now() - startedHere, 0), late],
        )
        await client.query('COMMIT')
        return rows[0]!.outcome
      })
    },

    /** The recorded bans that have not ended yet, by key id (all keys, or the ones named). */
    async activeBans(ids?: string[]): Promise<Map<string, RecordedBan>> {
      const { rows } = await pool.query<RecordedBan>(
        `SELECT key_id AS "keyId", step, started_at AS "startedAt", ends_at AS "endsAt" FROM gateway.api_key_bans
          WHERE ends_at > now() AND ($1::text[] IS NULL OR key_id = ANY($1))`,
        [ids ?? null],
      )
      return new Map(rows.map((ban) => [ban.keyId, ban]))
    },

    /**
     * Asks every gateway to lift the key's ban; returns the change log entry that carries the
     * request, or null when no such key exists. The ban's record goes when a gateway applies it.
     */
    async requestUnban(id: string): Promise<number | null> {
      const { rows } = await pool.query<{ id: number }>(
        `WITH change AS (
           INSERT INTO gateway.api_key_changes (key_id, key_hash, kind)
           SELECT id, key_hash, 'unban' FROM gateway.api_keys WHERE id = $1 RETURNING id, key_id
         )
         SELECT id, pg_notify('gateway_api_key_changes', key_id) FROM change`,
        [id],
      )
      return rows[0]?.id ?? null
    },

    /**
     * Unbans no gateway has applied to the rate-limit store yet: a day old at most, and older than
     * the few seconds running gateways take to apply a fresh one. One that a newer ban has
     * overtaken (its key was banned again after it was asked for) is marked applied instead:
     * lifting it late would lift that newer ban. Which came first is read on Postgres's clock
     * alone (the ban's recorded_at, the unban's changed_at): the ban's started_at is Redis's.
     */
    async pendingUnbans(): Promise<KeyChange[]> {
      // The pending unbans by their ids, which the planner counts as a few: it takes every
      // 'updated' entry for pending too (their applied_at is NULL as well), and with a hundred
      // thousand of them expected it read every ban record, on every run (30 ms at 100,000 records
      // and 3 M entries, measured), where the few real ones each look up their key's record. A
      // lookup per unban written as a subquery is costed for that hundred thousand as well, and
      // the cost has Postgres compile the statement (JIT, 130 ms).
      await pool.query(
        `UPDATE gateway.api_key_changes c SET applied_at = now()
           FROM gateway.api_key_bans b
          WHERE c.id = ANY(ARRAY(SELECT id FROM gateway.api_key_changes WHERE kind = 'unban' AND applied_at IS NULL))
            AND c.kind = 'unban' AND c.applied_at IS NULL AND b.key_id = c.key_id AND b.recorded_at > c.changed_at`,
      )
      const { rows } = await pool.query<KeyChange>(
        `SELECT id, key_id AS "keyId", key_hash AS "keyHash", kind, false AS applied FROM gateway.api_key_changes
          WHERE kind = 'unban' AND applied_at IS NULL AND changed_at > now() - interval '1 day'
            AND changed_at < now() - interval '3 seconds'
          ORDER BY id LIMIT 100`,
      )
      return rows
    },

    /**
     * Marks an unban applied and deletes the record of the ban it lifted. `announce` (an unban
     * applied late, from the pending ones): the first gateway to mark it also appends an applied
     * copy to the log, so every gateway forgets a ban its cache may have learnt again from Redis
     * meanwhile. Resolves true for the call that marked it (false: it was marked already).
     */
    async markUnbanApplied(changeId: number, announce = false): Promise<boolean> {
      return withConnection(pool, async (client) => {
        // READ COMMITTED whatever the database's default: what the lock waited for is read after it.
        await client.query('BEGIN ISOLATION LEVEL READ COMMITTED')
        await client.query(LOCK_KEY_OF_CHANGE, [changeId])
        const { rows } = await client.query<{ marked: boolean }>(
          `WITH applied AS (
             UPDATE gateway.api_key_changes SET applied_at = now() WHERE id = $1 AND applied_at IS NULL
             RETURNING key_id, key_hash, changed_at
           ), lifted AS (
             DELETE FROM gateway.api_key_bans b USING applied a WHERE b.key_id = a.key_id AND b.recorded_at <= a.changed_at
           ), again AS (
             INSERT INTO gateway.api_key_changes (key_id, key_hash, kind, applied_at)
             SELECT key_id, key_hash, 'unban', now() FROM applied WHERE $2 RETURNING key_id
           )
           SELECT EXISTS (SELECT 1 FROM applied) AS marked,
                  (SELECT count(pg_notify('gateway_api_key_changes', key_id)) FROM again) AS notified`,
          [changeId, announce],
        )
        await client.query('COMMIT')
        return rows[0]!.marked
      })
    },

    async isUnbanApplied(changeId: number): Promise<boolean> {
      const { rows } = await pool.query('SELECT 1 FROM gateway.api_key_changes WHERE id = $1 AND applied_at IS NOT NULL', [changeId])
      return rows.length > 0
    },

    /**
     * The change log only needs to outlive the cache TTL, a ban record its ban; a day is generous.
     * Deleted oldest first in batches, each its own statement under the pool's timeout (one
     * operator transaction can leave millions of entries), rows another gateway's purge holds
     * skipped; a batch the statement timeout cancels (a loaded database) is tried again at half the
     * size (deleteInBatches). Returns the rows removed.
     */
    async purgeChanges(batchRows = PURGE_BATCH_ROWS): Promise<number> {
      // The log in id order, each batch from where the last one ended: while another session's
      // transaction keeps the deleted rows' index entries from being pruned, a batch from the start
      // would step over them again. Only the primary key must serve it: with statistics from before
      // the backlog aged (the day's entries all newer then), the planner expects few old entries and
      // would read and sort the whole log for every batch (138 ms a batch at 400,000 entries, past a
      // 100 ms timeout, measured).
      let purged = await withConnection(pool, (client) => {
        let after = 0
        return deleteInBatches(batchRows, async (rows) => {
          const [batch] = await inIndexOrder<{ deleted: number; last: number | null }>(
            client,
            `WITH deleted AS (
               DELETE FROM gateway.api_key_changes WHERE ctid = ANY(ARRAY(
                 SELECT ctid FROM gateway.api_key_changes WHERE id > $2 AND changed_at < now() - interval '1 day'
                  ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
               RETURNING id)
             SELECT count(*)::int AS deleted, max(id) AS last FROM deleted`,
            [rows, after],
          ).catch(async (error: unknown) => {
            // Cancelled, Postgres answered: the transaction ends here and the next batch goes on this connection.
            if (isQueryCanceled(error)) await client.query('ROLLBACK')
            throw error
          })
          after = batch?.last ?? after
          return batch?.deleted ?? 0
        })
      })
      // Bans: one record per key at most.
      purged += await deleteInBatches(batchRows, async (rows) => {
        const { rowCount } = await pool.query(
          `DELETE FROM gateway.api_key_bans WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM gateway.api_key_bans WHERE ends_at < now() - interval '1 day' LIMIT $1 FOR UPDATE SKIP LOCKED))`,
          [rows],
        )
        return rowCount ?? 0
      })
      return purged
    },
  }
}

export type KeyRepository = ReturnType<typeof createKeyRepository>
