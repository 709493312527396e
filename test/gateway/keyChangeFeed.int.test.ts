import pg from 'pg'
import pino from 'pino'
import { describe, expect, it, vi } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { hashApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyCache } from '../../gateway/src/keys/keyCache.ts'
import { startKeyChangeFeed, type KeyChangeFeedOptions } from '../../gateway/src/keys/keyChangeFeed.ts'
import { createKeyRepository, isUsable, type FeedEntry, type KeyChange, type KeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { freePort } from '../helpers/ports.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/**
 * The repository as the feed reads it, with a look at each read: `position` when it takes the
 * log's position, `page` around each page of entries (to count them, or to fail one).
 */
function watched(
  repository: KeyRepository,
  watch: { position?: () => void; page?: <T extends FeedEntry>(kind: 'byId' | 'byXid', read: () => Promise<T[]>) => Promise<T[]> },
): KeyChangeFeedOptions['repository'] {
  const page = watch.page ?? ((_kind, read) => read())
  return {
    changeLogPosition: (bound) => (watch.position?.(), repository.changeLogPosition(bound)),
    changesById: (after, limit, snapshot, bound) => page('byId', () => repository.changesById(after, limit, snapshot, bound)),
    changesByXid: (range, snapshot, bound) => page('byXid', () => repository.changesByXid(range, snapshot, bound)),
    committedAmong: (xids, upTo, bound) => repository.committedAmong(xids, upTo, bound),
  }
}

/** Adds the rows' count to `total` and hands them on. */
function countRows<T>(rows: T[], total: { count: number }): T[] {
  total.count += rows.length
  return rows
}

describe('API key change notifications', () => {
  const database = suiteDatabase()

  // Where LISTEN is unavailable (a transaction pooler, a lost connection) the periodic read alone
  // must keep the promise that a revocation reaches every gateway within 2 s.
  it('deliver a revocation within 2 s by the periodic read alone when LISTEN cannot connect', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const repository = createKeyRepository(pool)
    const nowhere = new URL(database.url)
    nowhere.port = String(await freePort())
    const seen: KeyChange[] = []
    const feed = await startKeyChangeFeed({ repository, connectionString: nowhere.toString(), onChange: (change) => seen.push(change), logger: pino({ level: 'silent' }) })
    try {
      const { record } = await repository.create({ name: 'polled', plan: 'free' })
      await repository.revoke(record.id)
      await vi.waitFor(() => expect(seen.map((change) => change.keyId)).toContain(record.id), { timeout: 2_000, interval: 50 })
    } finally {
      await feed.stop()
      await pool.end()
    }
  })

  /**
   * A feed whose LISTEN connection goes through a relay the test can cut (its periodic read is a
   * minute away, so only NOTIFY can deliver a change within a test), with what it delivered.
   */
  async function feedThroughRelay(options: { cutBeforeStart?: boolean } = {}) {
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const repository = createKeyRepository(pool)
    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const viaRelay = new URL(database.url)
    viaRelay.port = String(relay.port)
    if (options.cutBeforeStart) await relay.cut()
    const seen: KeyChange[] = []
    const feed = await startKeyChangeFeed({
      repository,
      connectionString: viaRelay.toString(),
      onChange: (change) => seen.push(change),
      logger: pino({ level: 'silent' }),
      pollMillis: 60_000,
    })
    return {
      relay,
      /** Revokes a new key and waits until the feed has delivered that change. */
      async revocationArrives(name: string, timeout: number) {
        const { record } = await repository.create({ name, plan: 'free' })
        await repository.revoke(record.id)
        await vi.waitFor(() => expect(seen.map((change) => change.keyId)).toContain(record.id), { timeout, interval: 50 })
      },
      async stop() {
        await feed.stop()
        await relay.close()
        await pool.end()
      },
    }
  }

  it('come back by themselves after Postgres was unreachable for longer than one retry', async () => {
    const subject = await feedThroughRelay()
    try {
      await subject.revocationArrives('before', 2_000)
      // Longer than the 5 s between attempts, so at least one attempt to listen again fails too.
      await subject.relay.cut()
      await new Promise((resolve) => setTimeout(resolve, 7_000))
      await subject.relay.restore()
      await subject.revocationArrives('after', 8_000)
    } finally {
      await subject.stop()
    }
  }, 30_000)

  it('say once that their periodic read fails while Postgres cannot be reached, not at every read, again at each reminder period, and once that it works again', async () => {
    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const viaRelay = new URL(database.url)
    viaRelay.port = String(relay.port)
    const pool = createPool({ connectionString: viaRelay.toString(), applicationName: 'key-feed-test', connectionTimeoutMillis: 500 })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const lines: { level: number; msg: string; failedReads?: number }[] = []
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line)) })
    // Said again every 2 s here (a minute by default).
    const feed = await startKeyChangeFeed({ repository: createKeyRepository(pool), connectionString: viaRelay.toString(), onChange: () => undefined, logger, pollMillis: 100, failingToldEveryMillis: 2_000 })
    try {
      await relay.cut()
      const said = (text: string) => lines.filter((line) => line.msg.startsWith(text))
      // A read every 100 ms fails meanwhile: one warning, then the first reminder 2 s on, with the count so far.
      await vi.waitFor(() => expect(said('reading API key changes still fails')).toHaveLength(1), { timeout: 6_000, interval: 50 })
      expect(said('reading API key changes failed')).toHaveLength(1)
      expect(said('reading API key changes still fails')[0]!.failedReads).toBeGreaterThanOrEqual(5)
      await relay.restore()
      await vi.waitFor(() => expect(said('reading API key changes works again')).toHaveLength(1), { timeout: 5_000, interval: 50 })
      expect(said('reading API key changes works again')[0]!.failedReads).toBeGreaterThanOrEqual(said('reading API key changes still fails')[0]!.failedReads!)
      expect(said('reading API key changes failed')).toHaveLength(1)
    } finally {
      await feed.stop()
      await relay.close()
      await pool.end()
    }
  }, 30_000)

  // A network or NAT that drops an idle connection silently: no error, no close, nothing answered.
  it('come back by themselves after their connection stopped answering without being closed', async () => {
    const subject = await feedThroughRelay()
    try {
      await subject.revocationArrives('before', 2_000)
      await subject.relay.silence()
      // New connections are carried again; the listening one stays mute.
      await subject.relay.restore()
      // A ping within 5 s, its 2 s for an answer, 5 s before listening again, and slack for a
      // loaded machine (15 s in all was once too little on a slow one).
      await subject.revocationArrives('after', 20_000)
    } finally {
      await subject.stop()
    }
  }, 30_000)

  // A gateway stopping while its listening connection is mute waited for Postgres to confirm the
  // end of a session nothing answers on, for good (the gateway's shutdown bound cut it short).
  it('stop within seconds while their listening connection stopped answering', async () => {
    const subject = await feedThroughRelay()
    await subject.revocationArrives('before', 2_000)
    await subject.relay.silence()
    const started = performance.now()
    await subject.stop()
    expect(performance.now() - started).toBeLessThan(5_000)
  }, 30_000)

  // A gateway whose event loop is held up (a long GC pause, a CPU-starved container) reads the
  // ping's answer late: that is its own lag, not a mute connection.
  it('stay on their connection when the gateway itself is too busy to read the ping answer for over 2 s', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const warnings: string[] = []
    const logger = pino({ level: 'warn' }, { write: (line: string) => void warnings.push(JSON.parse(line).msg) })
    const feed = await startKeyChangeFeed({ repository: createKeyRepository(pool), connectionString: database.url, onChange: () => undefined, logger, pollMillis: 60_000 })
    try {
      // Busy 2.5 s at a time, with a turn of the event loop between, for longer than the 5 s between
      // pings: a ping goes out in one of those turns and its answer waits in the socket.
      const until = performance.now() + 6_000
      while (performance.now() < until) {
        const busyUntil = performance.now() + 2_500
        while (performance.now() < busyUntil);
        await new Promise((resolve) => setImmediate(resolve))
      }
      await new Promise((resolve) => setTimeout(resolve, 200))
      expect(warnings).toEqual([])
    } finally {
      await feed.stop()
      await pool.end()
    }
  }, 30_000)

  // A failover behind the same address (or a NAT that forgot the connections): the gateway's pooled
  // connections and its LISTEN one stay open and go mute, new connections are answered. A read that
  // took a mute pooled connection waited out the pool's whole bound (5 s statement timeout and
  // grace) before the next one connected afresh: revocations arrived after about 6 s.
  it('deliver a revocation within 2 s when their pooled connections go mute and new ones are answered (a failover behind the same address)', async () => {
    const target = new URL(database.url)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const viaRelay = new URL(database.url)
    viaRelay.port = String(relay.port)
    const pool = createPool({ connectionString: viaRelay.toString(), applicationName: 'key-feed-test' })
    // The operator's CLI, on connections of its own.
    const operatorPool = createPool({ connectionString: database.url, applicationName: 'key-feed-test-operator' })
    await migrate(operatorPool, GATEWAY_MIGRATIONS)
    const operator = createKeyRepository(operatorPool)
    const seen: KeyChange[] = []
    const feed = await startKeyChangeFeed({ repository: createKeyRepository(pool), connectionString: viaRelay.toString(), onChange: (change) => seen.push(change), logger: pino({ level: 'silent' }) })
    try {
      // Connections idle in the pool, as a gateway under traffic has.
      await Promise.all(Array.from({ length: 4 }, () => pool.query('SELECT pg_sleep(0.05)')))
      await relay.silence()
      await relay.restore()
      const { record } = await operator.create({ name: 'revoked across a failover', plan: 'free' })
      await operator.revoke(record.id)
      const committed = performance.now()
      await vi.waitFor(() => expect(seen.map((change) => change.keyId)).toContain(record.id), { timeout: 10_000, interval: 20 })
      const arrivedAfter = performance.now() - committed
      expect(arrivedAfter).toBeLessThan(2_000)
      recordScenario({
        area: 'Postgres',
        scenario: "The gateway's open Postgres connections go mute while new ones are answered (a failover behind the same address), and a key is revoked",
        answered: `the revocation reached the gateway ${(arrivedAfter / 1_000).toFixed(1)} s after its commit (bound 2 s; 6.7 s before the feed's reads were held to 600 ms)`,
        lost: 'nothing: the change delivered once',
        test: 'test/gateway/keyChangeFeed.int.test.ts',
      })
    } finally {
      await feed.stop()
      await relay.close()
      await pool.end()
      await operatorPool.end()
    }
  }, 30_000)

  it('come back by themselves when Postgres was not reachable yet as the gateway started', async () => {
    const subject = await feedThroughRelay({ cutBeforeStart: true })
    try {
      await subject.relay.restore()
      await subject.revocationArrives('after a late start', 10_000)
    } finally {
      await subject.stop()
    }
  }, 30_000)

  // A change is delivered once: delivered again at every periodic read, it would evict its key
  // from every gateway's cache each second (a Postgres query per key in use) and lift an
  // unbanned key's later bans again and again.
  it('deliver each change once, however many periodic reads follow it', async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const repository = createKeyRepository(pool)
    const reads = { count: 0 }
    const seen: KeyChange[] = []
    const feed = await startKeyChangeFeed({
      repository: watched(repository, { position: () => reads.count++ }),
      connectionString: database.url,
      onChange: (change) => seen.push(change),
      logger: pino({ level: 'silent' }),
      pollMillis: 50,
    })
    try {
      const { record } = await repository.create({ name: 'once', plan: 'free' })
      await repository.setPlan(record.id, 'pro')
      const changes = (await pool.query<{ id: number }>('SELECT id FROM gateway.api_key_changes WHERE key_id = $1', [record.id])).rows.map((row) => row.id)
      await vi.waitFor(() => expect(seen.filter((change) => change.keyId === record.id).map((change) => change.id).sort()).toEqual(changes.sort()), {
        timeout: 5_000,
        interval: 50,
      })
      const readsThen = reads.count
      await vi.waitFor(() => expect(reads.count).toBeGreaterThanOrEqual(readsThen + 5), { timeout: 10_000, interval: 50 })
      expect(seen.filter((change) => change.keyId === record.id).map((change) => change.id).sort()).toEqual(changes.sort())
    } finally {
      await feed.stop()
      await pool.end()
    }
  })

  /**
   * Two keys on a migrated schema: `slow` is revoked in a transaction left open (its change-log id
   * taken, the change not visible yet), `quick` changed meanwhile and committed at once.
   */
  async function revocationLeftOpen(names: [string, string]) {
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const repository = createKeyRepository(pool)
    const [{ record: slow }, { record: quick }] = await Promise.all([
      repository.create({ name: names[0], plan: 'free' }),
      repository.create({ name: names[1], plan: 'free' }),
    ])
    const transaction = await pool.connect()
    return {
      repository,
      slow,
      quick,
      async revokeSlowThenChangeQuick() {
        await transaction.query('BEGIN')
        await transaction.query('UPDATE gateway.api_keys SET revoked_at = now(), updated_at = now() WHERE id = $1', [slow.id])
        await repository.setPlan(quick.id, 'pro')
      },
      commit: () => transaction.query('COMMIT'),
      async close() {
        transaction.release()
        await pool.end()
      },
    }
  }

  const follow = (repository: KeyRepository, seen: KeyChange[]) =>
    startKeyChangeFeed({ repository, connectionString: database.url, onChange: (change) => seen.push(change), logger: pino({ level: 'silent' }) })

  it('deliver a change that commits after a later one (a revocation inside a longer transaction)', async () => {
    const keys = await revocationLeftOpen(['revoked in a long transaction', 'changed meanwhile'])
    const seen: KeyChange[] = []
    const feed = await follow(keys.repository, seen)
    try {
      // The revocation takes its change-log id first, and commits last.
      await keys.revokeSlowThenChangeQuick()
      await vi.waitFor(() => expect(seen.map((change) => change.keyId)).toContain(keys.quick.id), { timeout: 2_000, interval: 50 })
      await keys.commit()
      const committed = performance.now()
      await vi.waitFor(() => expect(seen.map((change) => change.keyId)).toContain(keys.slow.id), { timeout: 3_000, interval: 50 })
      expect(performance.now() - committed).toBeLessThan(2_000)
      const ids = seen.map((change) => change.id)
      expect(ids.indexOf(Math.min(...ids))).toBe(ids.length - 1)
    } finally {
      await feed.stop()
      await keys.close()
    }
  })

  it('deliver a change whose transaction was still open when the gateway started', async () => {
    const keys = await revocationLeftOpen(['revoked across a gateway start', 'changed before the start'])
    let feed: Awaited<ReturnType<typeof startKeyChangeFeed>> | undefined
    try {
      await keys.revokeSlowThenChangeQuick()
      const seen: KeyChange[] = []
      feed = await follow(keys.repository, seen)
      await keys.commit()
      await vi.waitFor(() => expect(seen.map((change) => change.keyId)).toContain(keys.slow.id), { timeout: 3_000, interval: 50 })
      expect(seen.map((change) => change.keyId)).not.toContain(keys.quick.id)
    } finally {
      await feed?.stop()
      await keys.close()
    }
  })
})

describe('a gateway\'s key cache follows the change log whatever order its transactions commit in', () => {
  const database = suiteDatabase()

  /** A gateway's key cache and change feed, wired as main.ts wires them, and an operator's psql session. */
  async function gatewayAndOperator() {
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-order-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    const repository = createKeyRepository(pool)
    const operator = new pg.Client({ connectionString: database.url })
    await operator.connect()
    const cache = createKeyCache(repository, { maxEntries: 10_000, ttlMillis: 60_000, negativeTtlMillis: 60_000 })
    const follow = () =>
      startKeyChangeFeed({ repository, connectionString: database.url, onChange: (change) => cache.invalidate(change.keyHash), logger: pino({ level: 'silent' }) })
    const usable = async (key: string) => {
      const record = await cache.lookup(key)
      return record !== undefined && isUsable(record)
    }
    /** Whether the gateway would still accept the key within 2 s of the change's commit. */
    const refusedWithin2s = async (key: string) => {
      await vi.waitFor(async () => expect(await usable(key)).toBe(false), {
        timeout: 2_000,
        interval: 100,
      })
    }
    return { pool, repository, operator, cache, usable, follow, refusedWithin2s, close: async () => (await operator.end(), await pool.end()) }
  }

  it('refuses a key revoked in the same transaction as 1,100 other changes, committed after a later change', async () => {
    const { pool, repository, operator, usable, follow, refusedWithin2s, close } = await gatewayAndOperator()
    await pool.query(
      `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
       SELECT 'key_bulk' || g, sha256(('bulk' || g)::bytea), 'aas_bulk', 'bulk', 'free' FROM generate_series(1, 1100) g`,
    )
    const target = await repository.create({ name: 'target', plan: 'free' })
    const other = await repository.create({ name: 'other', plan: 'free' })
    const feed = await follow()
    try {
      await operator.query('BEGIN')
      await operator.query(`UPDATE gateway.api_keys SET plan = 'pro' WHERE name = 'bulk'`)
      await operator.query('UPDATE gateway.api_keys SET revoked_at = now() WHERE id = $1', [target.record.id])
      await repository.setPlan(other.record.id, 'pro')
      await new Promise((resolve) => setTimeout(resolve, 1_500))
      // A request loads the key while its revocation is not committed yet.
      expect(await usable(target.key)).toBe(true)
      await operator.query('COMMIT')
      await refusedWithin2s(target.key)
    } finally {
      await feed.stop()
      await close()
    }
  }, 20_000)

  it('refuses a key whose revocation was still open when the gateway started, behind 150 later changes', async () => {
    const { pool, repository, operator, usable, follow, refusedWithin2s, close } = await gatewayAndOperator()
    const slow = await repository.create({ name: 'slow', plan: 'free' })
    const others = await Promise.all(Array.from({ length: 150 }, (_, index) => repository.create({ name: `later ${index}`, plan: 'free' })))
    await operator.query('BEGIN')
    await operator.query('UPDATE gateway.api_keys SET revoked_at = now() WHERE id = $1', [slow.record.id])
    await pool.query(`UPDATE gateway.api_keys SET plan = 'business' WHERE id = ANY($1)`, [others.map(({ record }) => record.id)])
    const feed = await follow()
    try {
      expect(await usable(slow.key)).toBe(true)
      await operator.query('COMMIT')
      await refusedWithin2s(slow.key)
    } finally {
      await feed.stop()
      await close()
    }
  }, 20_000)

  it('refuses a key revoked in a transaction whose entries span several pages, and reads none of them again while another transaction stays open', async () => {
    const { pool, repository, operator, close } = await gatewayAndOperator()
    await pool.query(
      `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
       SELECT 'key_paged' || g, sha256(('paged' || g)::bytea), 'aas_paged', 'paged', 'free' FROM generate_series(1, 3000) g`,
    )
    const target = await repository.create({ name: 'target', plan: 'free' })
    const entriesRead = { count: 0 }
    const cache = createKeyCache(repository, { maxEntries: 100, ttlMillis: 60_000, negativeTtlMillis: 10_000 })
    const feed = await startKeyChangeFeed({
      repository: watched(repository, { page: async (_kind, read) => countRows(await read(), entriesRead) }),
      connectionString: database.url,
      onChange: (change) => cache.invalidate(change.keyHash),
      logger: pino({ level: 'silent' }),
      pageEntries: 500,
    })
    const idle = new pg.Client({ connectionString: database.url })
    await idle.connect()
    try {
      await operator.query('BEGIN')
      await operator.query('UPDATE gateway.api_keys SET revoked_at = now() WHERE id = $1', [target.record.id])
      await operator.query(`UPDATE gateway.api_keys SET plan = 'pro' WHERE name = 'paged'`)
      const usable = async () => {
        const record = await cache.lookup(target.key)
        return record !== undefined && isUsable(record)
      }
      expect(await usable()).toBe(true)
      // Another session holds a transaction open (an operator's psql), before and after the commit.
      await idle.query('BEGIN')
      await idle.query('SELECT pg_current_xact_id()')
      await operator.query('COMMIT')
      await vi.waitFor(async () => expect(await usable()).toBe(false), { timeout: 2_000, interval: 100 })
      // The revocation is on the transaction's first page; the feed may still be reading the rest.
      // A periodic read that took its position just before the commit and read the pages after it
      // returns them, and the next read returns them again (delivered once): at most twice.
      await vi.waitFor(() => expect(entriesRead.count).toBeGreaterThanOrEqual(3_001), { timeout: 2_000, interval: 50 })
      // Read again at every periodic read (one a second), the count would pass three times that.
      await new Promise((resolve) => setTimeout(resolve, 2_500))
      expect(entriesRead.count, 'not read again at every periodic read').toBeLessThanOrEqual(2 * 3_001)
    } finally {
      await idle.query('ROLLBACK').catch(() => undefined)
      await idle.end()
      await feed.stop()
      await close()
    }
  }, 30_000)

  // One transaction that changed more keys than a statement can read within its timeout: read as
  // one statement, every read of the log timed out for as long as those entries were in it (a
  // day), and no later revocation arrived. 200,000 entries and 150 ms stand for ~1.5 M and 5 s.
  it('still delivers a revocation made after one transaction that changed more keys than one statement can read in time', async () => {
    const setup = createPool({ connectionString: database.url, applicationName: 'key-feed-test-setup', statementTimeoutMillis: 60_000 })
    await migrate(setup, GATEWAY_MIGRATIONS)
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test', statementTimeoutMillis: 150 })
    const repository = createKeyRepository(pool)
    const seen: KeyChange[] = []
    const feed = await startKeyChangeFeed({ repository, connectionString: database.url, onChange: (change) => seen.push(change), logger: pino({ level: 'silent' }) })
    try {
      await setup.query(
        `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
         SELECT 'key_huge' || g, sha256(('huge' || g)::bytea), 'aas_huge', 'huge', 'free' FROM generate_series(1, 200000) g`,
      )
      await vi.waitFor(() => expect(seen.length).toBeGreaterThanOrEqual(200_000), { timeout: 20_000, interval: 100 })
      const { record } = await createKeyRepository(setup).create({ name: 'in use', plan: 'free' })
      await createKeyRepository(setup).revoke(record.id)
      await vi.waitFor(() => expect(seen.filter((change) => change.keyId === record.id)).toHaveLength(2), { timeout: 2_000, interval: 50 })
    } finally {
      await feed.stop()
      await pool.end()
      // Recent entries with ids below the purge test's backlog: the purge walks ids in order and
      // would step over them all in its first statement, which that test gives 100 ms.
      await setup.query(`DELETE FROM gateway.api_key_changes WHERE key_id LIKE 'key_huge%'`)
      await setup.end()
    }
  }, 60_000)

  it('goes on from the page where a read failed, delivering each entry once, rather than begin the backlog again', async () => {
    const { pool, repository, close } = await gatewayAndOperator()
    const seen: KeyChange[] = []
    let entriesRead = 0
    let fullPages = 0
    let failed = false
    const feed = await startKeyChangeFeed({
      repository: watched(repository, {
        page: async (kind, read) => {
          if (kind !== 'byId') return read()
          // The page after the third full one fails once (a connection lost mid-backlog).
          if (fullPages === 3 && !failed) {
            failed = true
            throw new Error('connection lost (injected)')
          }
          const changes = await read()
          entriesRead += changes.length
          if (changes.length === 500) fullPages++
          return changes
        },
      }),
      connectionString: database.url,
      onChange: (change) => seen.push(change),
      logger: pino({ level: 'silent' }),
      pageEntries: 500,
      pollMillis: 200,
    })
    try {
      await pool.query(
        `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
         SELECT 'key_resume' || g, sha256(('resume' || g)::bytea), 'aas_resume', 'resume', 'free' FROM generate_series(1, 3000) g`,
      )
      await vi.waitFor(() => expect(seen.filter((change) => change.keyId.startsWith('key_resume'))).toHaveLength(3_000), { timeout: 5_000, interval: 50 })
      expect(failed).toBe(true)
      // Begun again from its first page, the read would have returned the first 1,500 twice.
      expect(entriesRead).toBe(3_000)
      expect(new Set(seen.map((change) => change.id)).size).toBe(seen.length)
    } finally {
      await feed.stop()
      await close()
    }
  })

  // A log moved here with pg_dump keeps the old server's transaction ids, past any this server has
  // reached: read as written after every position, it was delivered whole as new and read again
  // every second, for a day.
  it('takes entries restored from another server for history: neither delivered nor read again', async () => {
    const { pool, repository, close } = await gatewayAndOperator()
    await pool.query(
      `INSERT INTO gateway.api_key_changes (key_id, key_hash, xid)
       SELECT 'key_moved' || g, sha256(('moved' || g)::bytea), ((pg_current_xact_id()::text)::bigint + 1000000)::text::xid8
         FROM generate_series(1, 2000) g`,
    )
    const seen: KeyChange[] = []
    const entriesRead = { moved: 0, all: 0 }
    const feed = await startKeyChangeFeed({
      repository: watched(repository, {
        page: async (_kind, read) => {
          const rows = await read()
          entriesRead.all += rows.length
          entriesRead.moved += rows.filter((row) => row.keyId.startsWith('key_moved')).length
          return rows
        },
      }),
      connectionString: database.url,
      onChange: (change) => seen.push(change),
      logger: pino({ level: 'silent' }),
      pollMillis: 100,
    })
    try {
      const { record } = await repository.create({ name: 'after the move', plan: 'free' })
      await repository.revoke(record.id)
      await vi.waitFor(() => expect(seen.filter((change) => change.keyId === record.id)).toHaveLength(2), { timeout: 2_000, interval: 50 })
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      expect(seen.filter((change) => change.keyId.startsWith('key_moved'))).toEqual([])
      expect(entriesRead.moved).toBe(0)
      // The two new entries, each read at most twice: an entry that commits while a read goes
      // through its pages is returned by that read and by the next (and delivered once).
      expect(entriesRead.all).toBeGreaterThanOrEqual(2)
      expect(entriesRead.all).toBeLessThanOrEqual(4)
    } finally {
      await feed.stop()
      await close()
    }
  })

  // Deleted as one statement, a backlog bigger than the pool's timeout allows (about 4 M entries
  // at 5 s) was rolled back every hour while it grew. 400,000 entries and 100 ms stand for it.
  it('purges a day-old backlog of the change log bigger than one statement can delete in time, and ended bans, and nothing newer', async () => {
    const setup = createPool({ connectionString: database.url, applicationName: 'key-feed-test-setup', statementTimeoutMillis: 60_000 })
    await migrate(setup, GATEWAY_MIGRATIONS)
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test', statementTimeoutMillis: 100 })
    const repository = createKeyRepository(pool)
    try {
      // Statistics from before the backlog, when a day's worth of entries were all recent: the
      // planner then expects few old entries, and sorted the whole log for each batch (138 ms a
      // batch here). The vacuum also clears the earlier tests' deleted entries, which the first
      // batch would step over otherwise.
      await setup.query(
        `INSERT INTO gateway.api_key_changes (key_id, key_hash)
         SELECT 'key_recent' || g, sha256(('recent' || g)::bytea) FROM generate_series(1, 20000) g`,
      )
      await setup.query('VACUUM ANALYZE gateway.api_key_changes')
      const { record } = await createKeyRepository(setup).create({ name: 'ban ended long ago', plan: 'free' })
      await setup.query(`INSERT INTO gateway.api_key_bans (key_id, step, started_at, ends_at) VALUES ($1, 0, now() - interval '3 days', now() - interval '2 days')`, [record.id])
      await setup.query(
        `INSERT INTO gateway.api_key_changes (key_id, key_hash, changed_at)
         SELECT 'key_old' || g, sha256(g::text::bytea), now() - interval '2 days' FROM generate_series(1, 400000) g`,
      )
      const newer = Number((await setup.query('SELECT count(*) FROM gateway.api_key_changes WHERE changed_at > now() - interval \'1 day\'')).rows[0].count)
      expect(await repository.purgeChanges(2_000)).toBe(400_001)
      const left = await setup.query(`SELECT count(*)::int AS count, count(*) FILTER (WHERE changed_at < now() - interval '1 day')::int AS old FROM gateway.api_key_changes`)
      expect(left.rows[0]).toEqual({ count: newer, old: 0 })
      expect((await setup.query('SELECT 1 FROM gateway.api_key_bans WHERE key_id = $1', [record.id])).rowCount).toBe(0)
    } finally {
      await pool.end()
      await setup.end()
    }
  }, 60_000)

  it('purges a backlog no single statement could delete within the timeout, halving a batch the timeout cancels', async () => {
    const setup = createPool({ connectionString: database.url, applicationName: 'key-feed-test-setup', statementTimeoutMillis: 60_000 })
    await migrate(setup, GATEWAY_MIGRATIONS)
    // 100 ms: too short for one DELETE of the whole backlog, as the first batch asked for here is;
    // the batches that fit are found by halving, however busy the machine.
    const pool = createPool({ connectionString: database.url, applicationName: 'key-feed-test', max: 1, statementTimeoutMillis: 100 })
    try {
      await setup.query(
        `INSERT INTO gateway.api_key_changes (key_id, key_hash, changed_at)
         SELECT 'key_halved' || g, sha256(('halved' || g)::bytea), now() - interval '2 days' FROM generate_series(1, 200000) g`,
      )
      const newer = Number((await setup.query('SELECT count(*) FROM gateway.api_key_changes WHERE changed_at > now() - interval \'1 day\'')).rows[0].count)
      expect(await createKeyRepository(pool).purgeChanges(200_000)).toBeGreaterThanOrEqual(200_000)
      const left = await setup.query(`SELECT count(*)::int AS count, count(*) FILTER (WHERE changed_at < now() - interval '1 day')::int AS old FROM gateway.api_key_changes`)
      expect(left.rows[0]).toEqual({ count: newer, old: 0 })
    } finally {
      await pool.end()
      await setup.end()
    }
  }, 60_000)

  it('refuses a key whose row was deleted by hand', async () => {
    const { repository, operator, cache, follow, close } = await gatewayAndOperator()
    const deleted = await repository.create({ name: 'deleted by hand', plan: 'free' })
    const feed = await follow()
    try {
      expect(await cache.lookup(deleted.key)).toBeDefined()
      await operator.query('DELETE FROM gateway.api_keys WHERE id = $1', [deleted.record.id])
      await vi.waitFor(async () => expect(await cache.lookup(deleted.key)).toBeUndefined(), { timeout: 2_000, interval: 100 })
    } finally {
      await feed.stop()
      await close()
    }
  }, 20_000)

  // A database restored from a backup (or failed over to a copy that was behind) hands out again the
  // change-log ids and transaction ids of what it lost: a change made as it came back, before the
  // gateway's next read, looked to the feed like one it had read, and its key stayed cached.
  it('refuses a key revoked as the database came back behind what the gateway had read (restored from a backup)', async () => {
    const { repository, operator, cache, close } = await gatewayAndOperator()
    const { record, key } = await repository.create({ name: 'revoked after the restore', plan: 'free' })
    expect(await cache.lookup(key)).toBeDefined()
    // Where the gateway had read up to on the server before the restore: 1,000 transactions and entries on.
    let restored = false
    const feed = await startKeyChangeFeed({
      repository: {
        ...repository,
        async changeLogPosition() {
          const position = await repository.changeLogPosition()
          if (restored) return position
          restored = true
          return { ...position, xmax: String(BigInt(position.xmax) + 1_000n), maxId: String(BigInt(position.maxId) + 1_000n), xip: [] }
        },
      },
      connectionString: database.url,
      onChange: (change) => cache.invalidate(change.keyHash),
      onRewound: () => cache.clear(),
      logger: pino({ level: 'silent' }),
    })
    try {
      await operator.query('UPDATE gateway.api_keys SET revoked_at = now() WHERE id = $1', [record.id])
      await vi.waitFor(async () => expect(isUsable((await cache.lookup(key))!)).toBe(false), { timeout: 2_000, interval: 100 })
    } finally {
      await feed.stop()
      await close()
    }
  }, 20_000)

  // Row triggers do not fire on TRUNCATE: every gateway went on accepting the keys it had cached
  // until the TTL (a minute by default), though none existed any more.
  it('refuses every key once the keys table is truncated by hand', async () => {
    const { repository, operator, cache, follow, close } = await gatewayAndOperator()
    // The tests before it leave some 200,000 keys, whose announcement took past 2 s on a loaded
    // machine: emptied before the gateway follows, the table holds this test's three.
    await operator.query('TRUNCATE gateway.api_keys CASCADE')
    const keys = await Promise.all([1, 2, 3].map((n) => repository.create({ name: `truncated ${n}`, plan: 'free' })))
    const feed = await follow()
    try {
      for (const { key } of keys) expect(await cache.lookup(key)).toBeDefined()
      await operator.query('TRUNCATE gateway.api_keys CASCADE')
      for (const { key } of keys) await vi.waitFor(async () => expect(await cache.lookup(key)).toBeUndefined(), { timeout: 2_000, interval: 100 })
    } finally {
      await feed.stop()
      await close()
    }
  }, 20_000)

  // The row's change was announced with its new hash only, and every gateway went on accepting the
  // old key from its cache until the TTL (a minute by default).
  it('refuses the old key of a row whose key hash was replaced by hand (a leaked key reissued under its id)', async () => {
    const { repository, operator, cache, follow, close } = await gatewayAndOperator()
    const leaked = await repository.create({ name: 'reissued by hand', plan: 'free' })
    const reissued = await repository.create({ name: 'the new secret, made elsewhere', plan: 'free' })
    await operator.query('DELETE FROM gateway.api_keys WHERE id = $1', [reissued.record.id])
    const feed = await follow()
    try {
      expect(await cache.lookup(leaked.key)).toBeDefined()
      await operator.query('UPDATE gateway.api_keys SET key_hash = $2 WHERE id = $1', [leaked.record.id, hashApiKey(reissued.key)])
      await vi.waitFor(async () => expect(await cache.lookup(reissued.key)).toMatchObject({ id: leaked.record.id }), { timeout: 2_000, interval: 100 })
      await vi.waitFor(async () => expect(await cache.lookup(leaked.key)).toBeUndefined(), { timeout: 2_000, interval: 100 })
    } finally {
      await feed.stop()
      await close()
    }
  }, 20_000)
})
