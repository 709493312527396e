import type { Logger } from 'pino'
import { countedLinesByKey } from '../ops/countedLines.ts'
import { isDatabaseUnavailable } from './pool.ts'

/** At most one line in this time for the requests Postgres being unavailable failed, with how many since the line before. */
export const POSTGRES_OUTAGE_LOG_INTERVAL_MILLIS = 60_000

/** Distinct causes counted at once; past them the counts start again (an outage has a few). */
const CAUSES_KEPT = 16

/**
 * Says the requests answered 503 because Postgres could not be reached, was too slow, or took no
 * connections: the first of each cause at once, with its error, then at most one line every
 * `intervalMillis` with the number of such requests since the line before and the last one's
 * error. Each used to have an error line with a stack of its own, so an outage wrote the log at
 * the request rate, pages of one stack repeated. A cause is the error's code and message (numbers
 * aside): counted under the first, a second cause went unsaid for a minute (connections ended by
 * a Postgres restart, then the client key file found missing at the reconnection). True when the
 * error is such a failure (it needs no line of its own).
 */
export function reportPostgresOutages(
  logger: Pick<Logger, 'error'>,
  who: string,
  intervalMillis = POSTGRES_OUTAGE_LOG_INTERVAL_MILLIS,
): (error: unknown) => boolean {
  const said = countedLinesByKey<string, unknown>(
    intervalMillis,
    (_cause, last, requests) =>
      logger.error({ err: last, requests, withinSeconds: intervalMillis / 1_000 }, `Postgres unavailable to the ${who}: requests answered 503`),
    CAUSES_KEPT,
  )
  return (error) => {
    if (!isDatabaseUnavailable(error)) return false
    said(causeOf(error), error)
    return true
  }
}

function causeOf(error: unknown): string {
  const { code, message } = error as { code?: unknown; message?: unknown }
  return `${String(code ?? '')} ${String(message ?? '').replace(/\d+/g, '#').slice(0, 200)}`
}
