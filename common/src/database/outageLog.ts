import type { Logger } from 'pino'
import { isDatabaseUnavailable } from './pool.ts'

/** At most one line in this time for the requests Postgres being unavailable failed, with how many since the line before. */
export const POSTGRES_OUTAGE_LOG_INTERVAL_MILLIS = 60_000

/**
 * Says the requests answered 503 because Postgres could not be reached, was too slow, or took no
 * connections: the first at once, with its error, then at most one line every `intervalMillis`
 * with the number of such requests since the line before and the last one's error. Each used to
 * have an error line with a stack of its own, so an outage wrote the log at the request rate,
 * pages of one stack repeated. True when the error is such a failure (it needs no line of its own).
 */
export function reportPostgresOutages(
  logger: Pick<Logger, 'error'>,
  who: string,
  intervalMillis = POSTGRES_OUTAGE_LOG_INTERVAL_MILLIS,
): (error: unknown) => boolean {
  let quiet: { requests: number; last?: unknown } | undefined
  const log = (error: unknown, requests: number) =>
    logger.error(
      { err: error, requests, withinSeconds: intervalMillis / 1_000 },
      `Postgres unavailable to the ${who}: requests answered 503`,
    )
  // After a line, the failures of an interval are counted; their line comes at its end.
  const quietFor = () => {
    const since: { requests: number; last?: unknown } = { requests: 0 }
    quiet = since
    setTimeout(() => {
      quiet = undefined
      if (since.requests === 0) return
      log(since.last, since.requests)
      quietFor()
    }, intervalMillis).unref()
  }
  return (error) => {
    if (!isDatabaseUnavailable(error)) return false
    if (quiet) {
      quiet.requests++
      quiet.last = error
      return true
    }
    log(error, 1)
    quietFor()
    return true
  }
}
