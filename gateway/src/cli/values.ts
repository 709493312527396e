import { BIDI_CONTROL, CONTROL_CHARACTER, LINE_SEPARATOR } from '../../../common/src/text/displaySafety.ts'
import { UsageError } from './errors.ts'

/** Custom per-key limits; always given together, per-day at least per-minute. */
export interface Limits {
  perMinute: number
  perDay: number
}

/** The largest value the key table's integer columns hold. */
const MAX_LIMIT = 2_147_483_647
const NAME_MAX = 200

export function parseLimit(option: string, raw: string): number {
  const value = /^\d+$/.test(raw) ? Number(raw) : Number.NaN
  if (!(value >= 1 && value <= MAX_LIMIT)) {
    throw new UsageError(`--${option} must be a whole number from 1 to ${MAX_LIMIT}, got "${raw}"`)
  }
  return value
}

/** `--per-minute` and `--per-day`: both or neither. */
export function parseLimits(perMinute: string | undefined, perDay: string | undefined): Limits | undefined {
  if (perMinute === undefined && perDay === undefined) return undefined
  if (perMinute === undefined || perDay === undefined) {
    throw new UsageError('--per-minute and --per-day go together: give both')
  }
  const limits = { perMinute: parseLimit('per-minute', perMinute), perDay: parseLimit('per-day', perDay) }
  if (limits.perDay < limits.perMinute) {
    throw new UsageError(`--per-day (${limits.perDay}) must be at least --per-minute (${limits.perMinute})`)
  }
  return limits
}

export function parseName(raw: string): string {
  const name = raw.trim()
  // Characters as the database's char_length counts them (code points), not UTF-16 units.
  const length = [...name].length
  if (length === 0 || length > NAME_MAX) {
    throw new UsageError(`--name must be 1 to ${NAME_MAX} characters, got ${length}`)
  }
  // Shown to operators in their terminals: nothing a terminal would obey, nothing that reorders the line.
  if (CONTROL_CHARACTER.test(name)) throw new UsageError('--name must not contain control characters (C0, DEL or C1)')
  if (BIDI_CONTROL.test(name)) {
    throw new UsageError('--name must not hold bidirectional override, embedding or isolate characters (U+202A–U+202E, U+2066–U+2069)')
  }
  // A name is one line, as a pet's is: --json printed these raw, and line-splitting readers broke there.
  if (LINE_SEPARATOR.test(name)) throw new UsageError('--name must not hold a line or paragraph separator (U+2028, U+2029)')
  return name
}

// The units the config file's durations take (windows, ladder), and weeks.
const DURATION = /^(\d{1,6})([smhdw])$/
const UNIT_MILLIS = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 } as const
const ISO = /^(\d{4})-(\d{2})-(\d{2})(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,3})?)?(?:Z|[+-]\d{2}:?\d{2})?)?$/

/**
 * When a key stops working: a moment, or a duration counted from the key's creation (by the
 * database's clock, as `created_at` is, so `--expires 90s` is 90 s after `createdAt`, not after
 * the CLI started).
 */
export type KeyExpiry = { at: Date } | { afterMillis: number }

/** `--expires`: a duration (90s, 30m, 12h, 30d, 8w) or an ISO date or date-time in the future (UTC unless it says otherwise). */
export function parseExpires(raw: string, now: Date): KeyExpiry {
  const usage = () =>
    new UsageError(`--expires must be a duration (90s, 30m, 12h, 30d, 8w) or an ISO date (2026-12-31, 2026-12-31T18:00:00Z), got "${raw}"`)
  const notFuture = () => new UsageError(`--expires ${raw} is not in the future`)
  const duration = DURATION.exec(raw)
  if (duration) {
    const afterMillis = Number(duration[1]) * UNIT_MILLIS[duration[2] as keyof typeof UNIT_MILLIS]
    if (new Date(now.getTime() + afterMillis).getUTCFullYear() > 9999) throw new UsageError(`--expires ${raw} is past 9999-12-31`)
    if (afterMillis <= 0) throw notFuture()
    return { afterMillis }
  }
  const iso = ISO.exec(raw)
  // A date-time without an offset is UTC, as a date alone is: JavaScript would read it in this
  // host's time zone, and the same command would give another expiry on another machine.
  const utc = raw.includes('T') && !/(?:Z|[+-]\d{2}:?\d{2})$/.test(raw) ? `${raw}Z` : raw
  const date = iso && validDay(Number(iso[1]), Number(iso[2]), Number(iso[3])) ? new Date(utc) : new Date(Number.NaN)
  if (Number.isNaN(date.getTime()) || date.getUTCFullYear() > 9999) throw usage()
  if (date <= now) throw notFuture()
  return { at: date }
}

function validDay(year: number, month: number, day: number): boolean {
  return month >= 1 && month <= 12 && day >= 1 && day <= new Date(Date.UTC(year, month, 0)).getUTCDate()
}
