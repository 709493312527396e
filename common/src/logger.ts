import { pino, type Logger } from 'pino'

/** Header values that must never reach a log line, whatever logs the request. */
const REDACTED = [
  'req.headers.authorization',
  'req.headers["x-internal-token"]',
  'request.headers.authorization',
  'request.headers["x-internal-token"]',
  'headers.authorization',
  'headers["x-internal-token"]',
]

/** The longest a line waits in the batch when traffic is too light to fill it. */
export const LOG_FLUSH_MILLIS = 250

/**
 * JSON lines on stdout, written in 4 KiB batches (one write per request would cost more than
 * the request's own work at a few thousand requests per second), and at the latest every
 * LOG_FLUSH_MILLIS: without that, a quiet service's lines would wait for 4 KiB of company, so an
 * operator would not see a lone request, and a SIGKILL would take minutes of lines with it.
 * Flushed on exit.
 */
export function createLogger(service: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  const destination = pino.destination({ dest: 1, minLength: 4_096, sync: false, periodicFlush: LOG_FLUSH_MILLIS })
  const logger = pino(
    {
      level,
      base: { service },
      redact: { paths: REDACTED, censor: '[redacted]' },
    },
    destination,
  )
  process.once('exit', () => {
    try {
      destination.flushSync()
    } catch {
      // Not open yet: nothing was buffered.
    }
  })
  return logger
}
