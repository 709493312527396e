import type { Logger } from 'pino'
import type { BanRecordOutcome, RecordedBan } from '../keys/keyRepository.ts'

export interface NewBan {
  keyId: string
  plan: string
  /** The ladder step, 0 for the first. */
  step: number
  /** Store time (Redis TIME) when the ban started and when it ends, in ms. */
  startedAtMillis: number
  endsAtMillis: number
  /**
   * False when the store was unreachable and this gateway's per-process fallback started the
   * ban: it holds on this gateway only, and is not recorded for the CLI.
   */
  shared: boolean
  /**
   * For a ban announced on a store reply that came after the budget: when its call was made, on
   * this process's monotonic clock. An unban asked for since was sent to the store after that
   * call, so it lifted the ban: the record is ordered from there, and not written once that
   * unban has been applied (as a record written again after a failure).
   */
  calledAt?: number
}

/** How often a ban's record is written again while Postgres refuses it, as pending unbans are retried. */
export const BAN_RECORD_RETRY_MILLIS = 2_000

/**
 * What a gateway does when a request starts a ban (rare: once per ban, on the gateway whose
 * request made it): one warning line, and a record in Postgres so `keys show` and `keys list`
 * can tell an operator which keys are banned and until when. The write never holds up the
 * answer. If it fails (Postgres restarting, unreachable) the ban still holds, the failure is
 * logged once, and the write is tried again every 2 s for as long as the ban lasts: a ban that
 * began during a Postgres restart is one `keys show` would otherwise never print.
 */
export function banJournal(options: {
  /** Resolves with what became of the record (keyRepository's recordBan). */
  record: (ban: RecordedBan, startedHere: number, late: boolean) => Promise<BanRecordOutcome>
  logger: Logger
  retryMillis?: number
}): (ban: NewBan) => void {
  const retryMillis = options.retryMillis ?? BAN_RECORD_RETRY_MILLIS
  // One write at a time: a record can wait in Postgres (its key's row held by an operator's open
  // transaction that deletes it or selects it FOR UPDATE) until the statement timeout, and a burst
  // of bans waiting so held every connection of the pool the key lookups of requests need.
  // A write that waited for its turn is late: an unban applied meanwhile found no record to delete.
  let writing: Promise<unknown> = Promise.resolve()
  let unsettled = 0
  const inTurn = <T>(write: (waited: boolean) => Promise<T>): Promise<T> => {
    const waited = unsettled > 0
    unsettled++
    const turn = writing.then(() => write(waited))
    writing = turn.catch(() => undefined).finally(() => unsettled--)
    return turn
  }
  return (ban) => {
    const startedHere = ban.calledAt ?? performance.now()
    const endsAt = new Date(ban.endsAtMillis)
    options.logger.warn(
      {
        keyId: ban.keyId,
        plan: ban.plan,
        step: ban.step,
        seconds: Math.round((ban.endsAtMillis - ban.startedAtMillis) / 1_000),
        until: endsAt.toISOString(),
        ...(ban.shared ? {} : { scope: 'this gateway (rate-limit store unavailable)' }),
      },
      'API key banned',
    )
    if (!ban.shared) return
    const lastsUntilHere = startedHere + (ban.endsAtMillis - ban.startedAtMillis)
    let failed = false
    const write = () => {
      inTurn((waited) =>
        options.record(
          { keyId: ban.keyId, step: ban.step, startedAt: new Date(ban.startedAtMillis), endsAt },
          startedHere,
          failed || waited || ban.calledAt !== undefined,
        ),
      ).then(
        (outcome) => {
          // Whatever the outcome, the write is not tried again: a key deleted since stays deleted.
          if (outcome === 'no key') options.logger.info({ keyId: ban.keyId }, 'ban not recorded for the keys CLI: the key no longer exists')
          else if (outcome === 'overtaken') options.logger.info({ keyId: ban.keyId }, 'ban not recorded for the keys CLI: a newer ban of the key is recorded')
          else if (!failed) return
          else if (outcome === 'recorded') options.logger.info({ keyId: ban.keyId }, 'ban recorded for the keys CLI after an earlier failure')
          else options.logger.info({ keyId: ban.keyId }, 'ban not recorded for the keys CLI: an unban applied since has lifted it')
        },
        (error: unknown) => {
          if (!failed) options.logger.error({ err: error, keyId: ban.keyId }, 'could not record the ban for the keys CLI; trying again while it lasts')
          failed = true
          if (performance.now() + retryMillis < lastsUntilHere) setTimeout(write, retryMillis).unref()
        },
      )
    }
    write()
  }
}
