import pg from 'pg'
import type { Logger } from 'pino'
import type { KeyChange, KeyRepository } from './keyRepository.ts'

export interface KeyChangeFeedOptions {
  repository: Pick<KeyRepository, 'latestChangeId' | 'changesSince' | 'changeIdsSince'>
  /** For the LISTEN connection; when LISTEN is unavailable the periodic read still works. */
  connectionString: string
  onChange: (change: KeyChange) => void
  logger: Logger
  /** Catch-up period: the bound on propagation when notifications are lost. */
  pollMillis?: number
  /**
   * How long an id skipped in the log is looked for (see below): the key cache's TTL, after
   * which the entry such a change would have invalidated has expired anyway.
   */
  missingIdMillis?: number
}

/** More ids than this between two entries is not transactions still open: a sequence jump, or a purged log. */
const MAX_MISSING_PER_JUMP = 1_000
/** At start, ids this far below the newest entry that are absent may be transactions still open. */
const START_LOOKBACK = 100

export const KEY_CHANGES_CHANNEL = 'gateway_api_key_changes'

/**
 * Follows gateway.api_key_changes so a revocation or plan change reaches this gateway's key
 * cache within a second: NOTIFY wakes it at once, and a periodic read of the log catches what
 * a notification could miss (a dropped LISTEN connection, PGlite, a transaction pooler).
 *
 * An entry's id is taken when its transaction inserts it, but the entry is seen only when that
 * transaction commits, so entries can appear out of id order: an operator's revocation inside a
 * longer transaction commits after a later CLI change. An id skipped over is therefore looked for
 * again on every read until it appears (or `missingIdMillis` pass: a rolled-back transaction
 * leaves its id unused forever).
 */
export async function startKeyChangeFeed(options: KeyChangeFeedOptions): Promise<{ stop(): Promise<void> }> {
  const { repository, logger } = options
  const missingIdMillis = options.missingIdMillis ?? 60_000
  let lastId = await repository.latestChangeId()
  /** Ids below lastId not seen yet, with when they were first missed. */
  const missing = new Map<number, number>()
  const missedBetween = (after: number, before: number) => {
    if (before - after - 1 > MAX_MISSING_PER_JUMP) return
    const now = Date.now()
    for (let id = after + 1; id < before; id++) missing.set(id, now)
  }
  // A change whose transaction is still open as this gateway starts commits below lastId.
  if (lastId > 0) {
    const floor = Math.max(lastId - START_LOOKBACK, 0)
    let previous = floor
    for (const id of await repository.changeIdsSince(floor)) {
      missedBetween(previous, id)
      previous = id
    }
  }

  const take = (change: KeyChange) => {
    if (change.id > lastId) {
      missedBetween(lastId, change.id)
      lastId = change.id
    } else {
      missing.delete(change.id)
    }
    options.onChange(change)
  }

  const forgetOldMissing = () => {
    const expired = Date.now() - missingIdMillis
    for (const [id, since] of missing) if (since < expired) missing.delete(id)
  }
  let stopped = false
  let reading: Promise<void> | undefined
  let again = false

  const catchUp = async (): Promise<void> => {
    if (reading) {
      again = true
      return reading
    }
    reading = (async () => {
      do {
        again = false
        try {
          forgetOldMissing()
          for (const change of await repository.changesSince(lastId, [...missing.keys()])) take(change)
        } catch (error) {
          logger.warn({ err: error }, 'reading API key changes failed; cached keys stay until their TTL')
        }
      } while (again && !stopped)
    })().finally(() => {
      reading = undefined
    })
    return reading
  }

  const timer = setInterval(() => void catchUp(), options.pollMillis ?? 1_000)
  timer.unref()

  let listener: pg.Client | undefined
  // Once LISTEN has worked, it is tried again every 5 s for as long as it is lost (Postgres down,
  // restarted): the periodic read bounds propagation meanwhile, NOTIFY makes it instant again.
  const RELISTEN_MILLIS = 5_000
  let reported = false
  let everListened = false
  const listenLater = () => {
    if (!stopped) setTimeout(() => void listen(), RELISTEN_MILLIS).unref()
  }
  const listen = async () => {
    if (stopped) return
    const client = new pg.Client({ connectionString: options.connectionString, connectionTimeoutMillis: 2_000 })
    let lost = false
    client.on('notification', () => void catchUp())
    client.on('error', (error) => {
      if (lost) return
      lost = true
      logger.warn({ err: error }, 'API key change notifications lost; relying on the periodic read')
      reported = true
      if (listener === client) listener = undefined
      client.end().catch(() => undefined)
      if (everListened) listenLater()
    })
    try {
      await client.connect()
      await client.query(`LISTEN ${KEY_CHANGES_CHANNEL}`)
      if (lost || stopped) return void client.end().catch(() => undefined)
      listener = client
      // Changes made while nobody listened are read now rather than at the next periodic read.
      if (everListened) void catchUp()
      everListened = true
      if (reported) logger.info('API key change notifications restored')
      reported = false
    } catch (error) {
      await client.end().catch(() => undefined)
      if (lost) return
      lost = true
      // A database that never took LISTEN (a transaction pooler) is not asked again.
      if (!everListened) return void logger.debug({ err: error }, 'LISTEN unavailable; relying on the periodic read')
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
      await reading
      await listener?.end().catch(() => undefined)
    },
  }
}
