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

export function createLogger(service: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  return pino({
    level,
    base: { service },
    redact: { paths: REDACTED, censor: '[redacted]' },
    timestamp: pino.stdTimeFunctions.isoTime,
  })
}
