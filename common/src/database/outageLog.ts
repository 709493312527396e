import type { Logger } from 'pino'
import { countedLines } from '../ops/countedLines.ts'
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
  const said = countedLines<unknown>(intervalMillis, (error, requests) =>
    logger.error({ err: error, requests, withinSeconds: intervalMillis / 1_000 }, `Postgres unavailable to the ${who}: requests answered 503`),
  )
  return (error) => {
    if (!isDatabaseUnavailable(error)) return false
    said(error)
    return true
  }
}
