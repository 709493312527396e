import pg from 'pg'
import type { Logger } from 'pino'
import { dropConnection, endWithin } from '../../../common/src/database/pool.ts'
import { oneRunAtATime } from '../../../common/src/lifecycle/oneRunAtATime.ts'
import { postgresNotThereYet } from '../../../common/src/database/waitForPostgres.ts'
import type { FeedEntry, FeedPosition, KeyChange, KeyRepository } from './keyRepository.ts'

export interface KeyChangeFeedOptions {
  repository: Pick<KeyRepository, 'changeLogPosition' | 'changesById' | 'changesByXid' | 'committedAmong'>
  /** For the LISTEN connection; when LISTEN is unavailable the periodic read still works. */
  connectionString: string
  onChange: (change: KeyChange) => void
  /**
   * The change log is behind what this feed had read (the database restored from a backup, or
   * failed over to a copy that was behind): the entries written since it came back reuse ids and
   * transaction ids the feed takes for read, so none of them can be told apart. Everything cached
   * from the log's keys is to be read again.
   */
  onRewound?: () => void
  logger: Logger
  /** Catch-up period: the bound on propagation when notifications are lost. */
  pollMillis?: number
  /** Entries read per statement (PAGE_ENTRIES; tests use fewer). */
  pageEntries?: number
  /** While the periodic read keeps failing, how often that is said again (FAILING_TOLD_EVERY_MILLIS; tests use less). */
  failingToldEveryMillis?: number
}

export const KEY_CHANGES_CHANNEL = 'gateway_api_key_changes'

/** A read of the change log under way (startKeyChangeFeed). */
interface ReadInProgress {
  /** The position the read moves to once it is done, taken before its first page. */
  next: FeedPosition
  /** Entries this read delivered, so an attempt that goes on after a failure delivers none twice. */
  deliveredNow: Set<number>
  /** Entries it delivered that the next read returns again (not visible at `next`). */
  again: Set<number>
  /** Later ids: read up to this id, or all of them. */
  newAfter: number | string
  newDone: boolean
  /** Transactions running at the previous read that have committed since. */
  committed?: string[]
  /** Which of them is being read (their count: the writers after the previous read), and from where. */
  olderIndex: number
  olderAfter?: { xid: string; id: number | string }
}

/**
 * Whether `next` is behind `since` on the same log: transaction ids only grow on one server, and
 * the highest id visible falls only when the log is emptied (the purge of a quiet day's entries,
 * to 0). A position taken on another server's history, ahead of this one, is not one to read from.
 */
function rewound(since: FeedPosition, next: FeedPosition): boolean {
  return BigInt(next.xmax) < BigInt(since.xmax) || (BigInt(next.maxId) > 0n && BigInt(next.maxId) < BigInt(since.maxId))
}

/** How long the LISTEN connection may take to answer LISTEN or a ping before it is taken for lost. */
const LISTEN_ANSWER_MILLIS = 2_000

/**
 * How long a statement of the periodic read may go without a byte of answer before its connection
 * is taken for mute (readBounded): an indexed read of a page of the log answers in milliseconds.
 * Within 2 s of a commit, with the 1 s between reads, one mute connection on the way included.
 */
const READ_ANSWER_MILLIS = 600

/** While the periodic read keeps failing, how often that is said again. */
const FAILING_TOLD_EVERY_MILLIS = 60_000

/** Entries read per statement: one operator transaction may hold millions, and each statement has the pool's timeout. */
const PAGE_ENTRIES = 5_000

/**
 * Follows gateway.api_key_changes so a revocation or plan change reaches this gateway's key
 * cache within a second: NOTIFY wakes it at once, and a periodic read of the log catches what
 * a notification could miss (a dropped LISTEN connection, PGlite, a transaction pooler).
 *
 * An entry's id is taken when its transaction inserts it, but the entry is seen only when that
 * transaction commits, so entries appear out of id order, and a transaction can stay open for
 * as long as an operator likes. So each read asks for exactly what was invisible at the previous
 * one (its position): entries with a later id, and the older ids of the transactions that were
 * still running then or wrote only after it. It never reads again what it saw, however long
 * another transaction stays open, and it reads in pages of a bounded size, so one transaction
 * that changed a million keys is read once, a page per statement, instead of timing out again
 * and again. An entry is delivered once; nothing is given up on by time or by count.
 */
export async function startKeyChangeFeed(options: KeyChangeFeedOptions): Promise<{ stop(): Promise<void> }> {
  const { repository, logger } = options
  // Entries visible at start are history: the cache they would invalidate is empty.
  let position = await repository.changeLogPosition()
  /** Entries the previous read delivered that this one returns again: those that became visible while it went through its pages. */
  let delivered = new Set<number>()

  /**
   * The read under way: its position to come and how far each of its steps has got. A statement
   * that fails leaves it in place, and the next attempt goes on from there: a backlog of many
   * pages is not begun again from its first page at every failure.
   */
  let inProgress: ReadInProgress | undefined

  /** One read of the log, each statement on a connection bound by `answerWithinMillis` when given (readBounded). */
  const readOnce = async (answerWithinMillis?: number): Promise<void> => {
    const since = position
    const read = (inProgress ??= {
      next: await repository.changeLogPosition(answerWithinMillis),
      deliveredNow: new Set(),
      again: new Set(),
      newAfter: since.maxId,
      newDone: false,
      olderIndex: 0,
    })
    if (rewound(since, read.next)) {
      logger.warn(
        { xmax: read.next.xmax, readUpToXmax: since.xmax, maxId: read.next.maxId, readUpToId: since.maxId },
        'the API key change log is behind what this gateway had read (restored from a backup, or failed over to a copy that was behind): every cached key is read again',
      )
      options.onRewound?.()
      position = read.next
      delivered = new Set()
      inProgress = undefined
      return
    }
    const limit = options.pageEntries ?? PAGE_ENTRIES
    const deliver = (change: FeedEntry) => {
      if (!change.inFirst) read.again.add(change.id)
      if (delivered.has(change.id) || read.deliveredNow.has(change.id)) return
      read.deliveredNow.add(change.id)
      options.onChange({ id: change.id, keyId: change.keyId, keyHash: change.keyHash, kind: change.kind, applied: change.applied })
    }
    // Later ids, in id order.
    while (!read.newDone) {
      const changes = await repository.changesById(read.newAfter, limit, read.next.snapshot, answerWithinMillis)
      changes.forEach(deliver)
      if (changes.length < limit) read.newDone = true
      else read.newAfter = changes.at(-1)!.id
    }
    // Then the older ids, in (xid, id) order: of each transaction running at the previous read
    // that has committed since, then of those that wrote only after it (an id is taken a moment
    // before the transaction's id).
    read.committed ??= await repository.committedAmong(since.xip, since.maxId, answerWithinMillis)
    while (read.olderIndex <= read.committed.length) {
      const xid = read.committed[read.olderIndex]
      const [fromXid, toXid] = xid === undefined ? [since.xmax, undefined] : [xid, xid]
      const after = read.olderAfter ?? { xid: fromXid, id: 0 }
      const changes = await repository.changesByXid({ fromXid, toXid, upTo: since.maxId, after, limit }, read.next.snapshot, answerWithinMillis)
      changes.forEach(deliver)
      if (changes.length < limit) {
        read.olderIndex++
        read.olderAfter = undefined
      } else {
        read.olderAfter = { xid: changes.at(-1)!.xid, id: changes.at(-1)!.id }
      }
    }
    position = read.next
    delivered = read.again
    inProgress = undefined
  }

  /**
   * Whether the next read's statements are held to READ_ANSWER_MILLIS: after a read that took
   * longer (Postgres loaded, the log locked by a migration), they have the pool's bound until one
   * is quick again, so a slow Postgres is not taken for a mute one at every read.
   */
  let quick = true
  /**
   * A read on a pooled connection that went mute (a failover behind the same address, a NAT that
   * forgot it) would wait out the pool's bound, 5.5 s, well past the 2 s a revocation has. Held to
   * READ_ANSWER_MILLIS, its connection is closed with the pool's idle ones, which went the same
   * way, and the read goes on at once on a fresh connection, from where it was (inProgress).
   */
  const readBounded = async (): Promise<void> => {
    const started = performance.now()
    const bound = quick ? READ_ANSWER_MILLIS : undefined
    quick = false
    try {
      await readOnce(bound)
    } catch (error) {
      // Only a read cut short for its silence goes on at once: one refused outright (Postgres
      // down) is not tried twice a second.
      if (bound === undefined || performance.now() - started < READ_ANSWER_MILLIS) throw error
      await readOnce()
    }
    quick = performance.now() - started < READ_ANSWER_MILLIS
  }

  let stopped = false

  /**
   * The failed reads since the last one that worked. A Postgres down for minutes fails the read of
   * every second: the first failure is told, then one line a minute while it lasts, and the read
   * that works again says so, rather than a warning per read.
   */
  let failing: { since: number; reads: number; toldAt: number } | undefined
  const catchUp = oneRunAtATime(async () => {
    try {
      await readBounded()
      if (failing) logger.info({ failedReads: failing.reads, failingSeconds: Math.round((performance.now() - failing.since) / 1_000) }, 'reading API key changes works again')
      failing = undefined
    } catch (error) {
      const now = performance.now()
      if (!failing) {
        failing = { since: now, reads: 1, toldAt: now }
        logger.warn({ err: error }, 'reading API key changes failed; cached keys stay until their TTL')
      } else {
        failing.reads++
        if (now - failing.toldAt >= (options.failingToldEveryMillis ?? FAILING_TOLD_EVERY_MILLIS)) {
          failing.toldAt = now
          logger.warn({ err: error, failedReads: failing.reads, failingSeconds: Math.round((now - failing.since) / 1_000) }, 'reading API key changes still fails; cached keys stay until their TTL')
        }
      }
    }
  }, () => !stopped)

  const timer = setInterval(() => void catchUp(), options.pollMillis ?? 1_000)
  timer.unref()

  let listener: pg.Client | undefined
  // Once LISTEN has worked, or while Postgres is not reachable yet, it is tried again every 5 s
  // for as long as it is lost (Postgres down, restarted): the periodic read bounds propagation
  // meanwhile, NOTIFY makes it instant again.
  const RELISTEN_MILLIS = 5_000
  // A connection that stops answering (a network or NAT that dropped it silently, a hung host)
  // reports nothing: it would stay the listener, deaf, for good. So LISTEN and a ping every
  // RELISTEN_MILLIS must be answered within LISTEN_ANSWER_MILLIS, or the connection is closed,
  // which reports it lost like any other.
  // The timer runs on this process's clock: after the event loop was held up (a long GC pause, a
  // CPU-starved host) it fires before the socket is read, the answer waiting there. So the
  // connection is closed only if one more turn of the loop, which reads it, brings no answer.
  const answered = async <T>(client: pg.Client, work: Promise<T>): Promise<T> => {
    let settled = false
    const timer = setTimeout(
      () => setImmediate(() => settled || dropConnection(client)),
      LISTEN_ANSWER_MILLIS,
    )
    try {
      return await work
    } finally {
      settled = true
      clearTimeout(timer)
    }
  }
  let reported = false
  let everListened = false
  const listenLater = () => {
    if (!stopped) setTimeout(() => void listen(), RELISTEN_MILLIS).unref()
  }
  const listen = async () => {
    if (stopped) return
    let client: pg.Client
    try {
      // Named, so an operator tells it in pg_stat_activity from the pool's `gateway` connections.
      client = new pg.Client({ connectionString: options.connectionString, connectionTimeoutMillis: 2_000, application_name: 'gateway-key-changes' })
    } catch (error) {
      // pg reads DATABASE_URL's sslrootcert, sslcert and sslkey as it makes a client: one that
      // cannot be read now (removed, a rotation half done) threw here, out of this timer's call,
      // and ended the process. It is tried again, as a Postgres that cannot be reached is.
      if (!reported) logger.warn({ err: error }, 'LISTEN unavailable; relying on the periodic read and trying again')
      reported = true
      return listenLater()
    }
    let lost = false
    client.on('notification', () => void catchUp())
    client.on('error', (error) => {
      if (lost) return
      lost = true
      logger.warn({ err: error }, 'API key change notifications lost; relying on the periodic read')
      reported = true
      if (listener === client) listener = undefined
      void endWithin(client)
      if (everListened || postgresNotThereYet(error)) listenLater()
    })
    try {
      await client.connect()
      await answered(client, client.query(`LISTEN ${KEY_CHANGES_CHANNEL}`))
      if (lost || stopped) return void endWithin(client)
      listener = client
      const ping = setInterval(() => void answered(client, client.query('SELECT 1')).catch(() => undefined), RELISTEN_MILLIS)
      ping.unref()
      client.once('end', () => clearInterval(ping))
      // Changes made while nobody listened are read now rather than at the next periodic read.
      if (everListened || reported) void catchUp()
      everListened = true
      if (reported) logger.info('API key change notifications restored')
      reported = false
    } catch (error) {
      await endWithin(client)
      if (lost) return
      lost = true
      // A database that refused LISTEN itself (a transaction pooler) is not asked again; one that
      // was not there yet at start (restarting, out of connection slots) is, like a lost one.
      if (!everListened && !postgresNotThereYet(error)) return void logger.debug({ err: error }, 'LISTEN unavailable; relying on the periodic read')
      if (!reported) logger.warn({ err: error }, 'LISTEN unavailable; relying on the periodic read and trying again')
      reported = true
      listenLater()
    }
  }
  await listen()

  return {
    async stop() {
      stopped = true
      clearInterval(timer)
      await catchUp.idle()
      if (listener) await endWithin(listener)
    },
  }
}
