import { pino, type Logger } from 'pino'
import { EnvError } from './env.ts'
import sonicBoom, { type SonicBoom } from 'sonic-boom'

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']

/** LOG_LEVEL, if set, must be one of pino's levels: otherwise the service refuses to start, naming it. */
export function checkLogLevel(env: NodeJS.ProcessEnv = process.env): void {
  const raw = env.LOG_LEVEL
  if (raw && !LOG_LEVELS.includes(raw)) throw new EnvError(`LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')} (got "${raw}")`)
}

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
 * Errors as pino serializes them, but for `data`: undici's parser errors keep there the bytes the
 * peer sent, and an upstream answering garbage may be echoing the request it got, internal
 * token, and a key the client put in its URL, included.
 */
function errorWithoutPeerBytes(error: Error): Record<string, unknown> {
  const serialized = pino.stdSerializers.err(error) as unknown as Record<string, unknown>
  const data = serialized.data
  if (data !== undefined) serialized.data = `[not logged: ${typeof data === 'string' ? `${data.length} characters` : 'bytes'} from the peer]`
  return serialized
}

// sonic-boom's module.exports is the class itself; its types describe an ES module's default export.
const SonicBoomStream = sonicBoom as unknown as typeof SonicBoom

/** The longest a line waits in the batch when traffic is too light to fill it. */
export const LOG_FLUSH_MILLIS = 250

/**
 * JSON lines on stdout, written in 4 KiB batches (one write per request would cost more than
 * the request's own work at a few thousand requests per second), and at the latest every
 * LOG_FLUSH_MILLIS: without that, a quiet service's lines would wait for 4 KiB of company, so an
 * operator would not see a lone request, and a SIGKILL would take minutes of lines with it.
 * Flushed on exit.
 *
 * The destination is sonic-boom 5, not pino.destination's sonic-boom 4: that one's synchronous
 * flush retries every write error but EAGAIN forever, so a service whose stdout reader had gone
 * (a log shipper that died, `npm start | head`) spun in its exit flush and never exited. Once
 * stdout fails, lines are dropped: logging must never stop or crash the service.
 */
export function createLogger(service: string, level = process.env.LOG_LEVEL || 'info'): Logger {
  // An unknown level stops the service at start (checkLogLevel), and this logger is what says so.
  if (!LOG_LEVELS.includes(level)) level = 'info'
  const destination = new SonicBoomStream({
    fd: 1,
    minLength: 4_096,
    sync: false,
    periodicFlush: LOG_FLUSH_MILLIS,
    contentMode: 'buffer',
  })
  // pino writes strings. In its string mode sonic-boom measures the whole pending batch on every
  // line (Buffer.byteLength of a growing concatenation, flattened each time): 1.3–1.7 µs a line at
  // 4 KiB batches, against 0.3–0.4 µs for turning the line into a Buffer and queueing that.
  // (Its types declare the string mode's write only.)
  const queue = destination.write.bind(destination) as unknown as (line: Buffer) => boolean
  destination.write = (line: string) => queue(Buffer.from(line))
  let broken = false
  destination.on('error', () => {
    broken = true
    destination.write = () => true
  })
  const logger = pino(
    {
      level,
      base: { service },
      redact: { paths: REDACTED, censor: '[redacted]' },
      serializers: { err: errorWithoutPeerBytes },
    },
    destination,
  )
  process.once('exit', () => {
    if (broken) return
    // A reader that is there but stopped reading (EAGAIN) gets about 2 s, not forever: no timer
    // runs during 'exit', so nothing else would end the wait.
    // sonic-boom reads `maxWriteRetries` on each retry; its types do not declare it.
    const bounded = destination as SonicBoom & { maxWriteRetries: number }
    bounded.maxWriteRetries = 20
    try {
      destination.flushSync()
    } catch {
      // Not open yet (nothing was buffered), stdout has no reader any more, or it stopped reading.
    }
  })
  return logger
}
