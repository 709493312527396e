import { escapeForDisplay } from '../../../common/src/text/displaySafety.ts'
import type { GatewayConfig } from '../config/loadConfig.ts'
import type { ApiKeyRecord, RecordedBan } from '../keys/keyRepository.ts'
import { keyLimit } from '../rateLimit/planLimits.ts'

export type Plans = GatewayConfig['plans']
export type KeyState = 'active' | 'revoked' | 'expired'

/** The key's ban in force as recorded by the gateway that started it, or null. */
export type BanOf = (record: ApiKeyRecord) => RecordedBan | null

export function keyState(record: ApiKeyRecord, now: Date): KeyState {
  if (record.revokedAt !== null) return 'revoked'
  if (record.expiresAt !== null && record.expiresAt <= now) return 'expired'
  return 'active'
}

export function hasCustomLimits(record: ApiKeyRecord): boolean {
  return record.perMinute !== null || record.perDay !== null
}

/**
 * The limits the gateway applies to the key (planLimits.ts): its own where set, else its plan's,
 * else the fail-safe strictest ones; null only when the config could not be read.
 */
export function effectiveLimits(record: ApiKeyRecord, plans: Plans | undefined) {
  if (!plans) return { perMinute: record.perMinute, perDay: record.perDay, failSafe: false }
  const perMinute = keyLimit(record, plans, 'perMinute')
  const perDay = keyLimit(record, plans, 'perDay')
  return { perMinute: perMinute.limit, perDay: perDay.limit, failSafe: perMinute.failSafe || perDay.failSafe }
}

/** Why a key gets the fail-safe limits, for `show` and the table. */
function failSafeReason(record: ApiKeyRecord, plans: Plans | undefined, limits: ReturnType<typeof effectiveLimits>): string {
  if (!plans || !limits.failSafe) return ''
  return Object.hasOwn(plans, record.plan)
    ? ` (strictest: plan ${record.plan} is "custom" and the key has no limits of its own)`
    : ` (strictest: plan ${record.plan} is not in the gateway config)`
}

const iso = (date: Date | null) => (date === null ? null : date.toISOString())

/** What --json prints for a key: never the key itself nor its hash. */
export function keyJson(record: ApiKeyRecord, plans: Plans | undefined, now: Date, ban: RecordedBan | null) {
  const limits = effectiveLimits(record, plans)
  return {
    id: record.id,
    prefix: record.displayPrefix,
    name: record.name,
    plan: record.plan,
    perMinute: limits.perMinute,
    perDay: limits.perDay,
    customLimits: hasCustomLimits(record),
    state: keyState(record, now),
    createdAt: iso(record.createdAt),
    expiresAt: iso(record.expiresAt),
    revokedAt: iso(record.revokedAt),
    ban: ban && { step: ban.step, startedAt: iso(ban.startedAt), endsAt: iso(ban.endsAt) },
  }
}

const count = (value: number | null) => (value === null ? '?' : value.toLocaleString('en-US'))

export function describeLimits(record: ApiKeyRecord, plans: Plans | undefined): string {
  const limits = effectiveLimits(record, plans)
  const remark = hasCustomLimits(record) ? ' (custom)' : failSafeReason(record, plans, limits)
  return `${count(limits.perMinute)}/min, ${count(limits.perDay)}/day${remark}`
}

export function describeTime(date: Date | null, none = 'never'): string {
  return date === null ? none : `${date.toISOString().slice(0, 19).replace('T', ' ')} UTC`
}

/** A name as the terminal should show it (one written by hand in psql may hold anything): escaped, one line, at most `max`. */
const printable = (text: string, max: number) => {
  const clean = escapeForDisplay(text)
  return clean.length > max ? `${clean.slice(0, max - 1)}…` : clean
}

export function shortPrefix(record: ApiKeyRecord): string {
  return `${record.displayPrefix}…`
}

function describeBan(ban: RecordedBan | null): string {
  if (!ban) return 'none'
  return `until ${describeTime(ban.endsAt)} (ladder step ${ban.step}, since ${describeTime(ban.startedAt)})`
}

/** The table's STATE: a ban shows on a key that is otherwise active. */
function tableState(record: ApiKeyRecord, now: Date, ban: RecordedBan | null): string {
  const state = keyState(record, now)
  // To the second: bans are minutes long, and "until 18:05" read at 18:05:02 of a ban ending at 18:05:09 says it is over.
  return state === 'active' && ban ? `banned until ${describeTime(ban.endsAt)}` : state
}

/** The key table, a header and one line per key, in pieces of up to 5,000 lines (so a million keys print without one giant string). */
export function keyTable(records: ApiKeyRecord[], plans: Plans | undefined, now: Date, banOf: BanOf): string[] {
  // The times to the minute, in UTC as every time the CLI prints (STATE's ban says so at its end).
  const header = ['ID', 'PREFIX', 'NAME', 'PLAN', 'LIMITS', 'STATE', 'CREATED (UTC)', 'EXPIRES (UTC)']
  // Every cell escaped: a plan written by hand in psql may hold what a terminal obeys, like a name.
  const rows = records.map((record) =>
    [
      record.id,
      shortPrefix(record),
      printable(record.name, 32),
      record.plan,
      describeLimits(record, plans),
      tableState(record, now, banOf(record)),
      describeTime(record.createdAt).slice(0, 16),
      // An operator looking for the keys about to lapse read each one's `show` for it.
      describeTime(record.expiresAt).slice(0, 16),
    ].map(escapeForDisplay),
  )
  // A loop, not Math.max(...lengths): spread as arguments, a hundred thousand keys overflow the stack.
  const widths = header.map((title) => title.length)
  for (const row of rows) for (const [column, cell] of row.entries()) widths[column] = Math.max(widths[column]!, cell.length)
  const line = (cells: string[]) => cells.map((cell, column) => cell.padEnd(widths[column] ?? 0)).join('  ').trimEnd()
  const pieces = [`${line(header)}\n`]
  for (let start = 0; start < rows.length; start += 5_000) pieces.push(rows.slice(start, start + 5_000).map((row) => `${line(row)}\n`).join(''))
  return pieces
}

/** `show` and the confirmation after each change: one field per line. */
export function keyDetails(record: ApiKeyRecord, plans: Plans | undefined, now: Date, ban: RecordedBan | null): string {
  const fields: [string, string][] = [
    ['id', record.id],
    ['prefix', shortPrefix(record)],
    ['name', printable(record.name, 200)],
    ['plan', record.plan],
    ['limits', describeLimits(record, plans)],
    ['state', tableState(record, now, ban)],
    ['created', describeTime(record.createdAt)],
    ['expires', describeTime(record.expiresAt)],
    ['revoked', describeTime(record.revokedAt, '-')],
    ['ban', describeBan(ban)],
  ]
  return fields.map(([label, value]) => `  ${label.padEnd(8)} ${escapeForDisplay(value)}`).join('\n') + '\n'
}
