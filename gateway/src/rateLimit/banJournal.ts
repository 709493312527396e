import type { Logger } from 'pino'
import type { RecordedBan } from '../keys/keyRepository.ts'

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
}

/**
 * What a gateway does when a request starts a ban (rare: once per ban, on the gateway whose
 * request made it): one warning line, and a record in Postgres so `keys show` and `keys list`
 * can tell an operator which keys are banned and until when. The write never holds up the
 * answer; if it fails the ban still holds and the failure is logged.
 */
export function banJournal(options: { record: (ban: RecordedBan, startedHere: number) => Promise<void>; logger: Logger }): (ban: NewBan) => void {
  return (ban) => {
    const startedHere = performance.now()
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
    options
      .record({ keyId: ban.keyId, step: ban.step, startedAt: new Date(ban.startedAtMillis), endsAt }, startedHere)
      .catch((error: unknown) => options.logger.error({ err: error, keyId: ban.keyId }, 'could not record the ban for the keys CLI'))
  }
}
