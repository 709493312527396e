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

/**
 * JSON lines on stdout, written in 4 KiB batches (one write per request would cost more than
 * the request's own work at a few thousand requests per second), flushed on exit.
 */
export function createLogger(service: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  const destination = pino.destination({ dest: 1, minLength: 4_096, sync: false })
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
