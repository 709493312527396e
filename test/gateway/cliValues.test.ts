import { describe, expect, it } from 'vitest'
import { parseCommand } from '../../gateway/src/cli/args.ts'
import { keyDetails, keyTable } from '../../gateway/src/cli/format.ts'
import { parseExpires, parseLimits, parseName } from '../../gateway/src/cli/values.ts'
import type { ApiKeyRecord } from '../../gateway/src/keys/keyRepository.ts'

const now = new Date('2026-11-25T12:00:00Z')

/** A key row as the repository gives it: free, no limits of its own, never expiring, unless told otherwise. */
const keyRecord = (fields: Partial<ApiKeyRecord>): ApiKeyRecord => ({
  id: 'key_abcdefghijkl',
  displayPrefix: 'aas_abcdef',
  name: 'acme',
  plan: 'free',
  perMinute: null,
  perDay: null,
  createdAt: new Date('2026-01-01T00:00:00Z'),
  expiresAt: null,
  revokedAt: null,
  ...fields,
})

describe('keys --expires', () => {
  it.each([
    ['45s', 45_000],
    ['1m', 60_000],
    ['90m', 90 * 60_000],
    ['12h', 12 * 3_600_000],
    ['30d', 30 * 86_400_000],
    ['2w', 14 * 86_400_000],
  ])("takes %s, the same units as the config file and weeks, as a duration from the key's creation", (raw, afterMillis) => {
    expect(parseExpires(raw, now)).toEqual({ afterMillis })
  })

  it.each([
    ['2026-12-31', '2026-12-31T00:00:00.000Z'],
    ['2026-12-31T18:00:00Z', '2026-12-31T18:00:00.000Z'],
  ])('takes the ISO date %s as a moment', (raw, expected) => {
    expect(parseExpires(raw, now)).toEqual({ at: new Date(expected) })
  })

  it.each(['1y', '1.5h', 'soon', '2026-02-30'])('refuses %s, naming the forms it takes', (raw) => {
    expect(() => parseExpires(raw, now)).toThrow(`--expires must be a duration (90s, 30m, 12h, 30d, 8w) or an ISO date (2026-12-31, 2026-12-31T18:00:00Z), got "${raw}"`)
  })

  it('refuses a duration that ends past the year 9999, saying so', () => {
    expect(() => parseExpires('999999w', now)).toThrow('--expires 999999w is past 9999-12-31')
  })

  it('refuses a moment that is not in the future', () => {
    expect(() => parseExpires('0m', now)).toThrow('--expires 0m is not in the future')
    expect(() => parseExpires('2026-11-24', now)).toThrow('--expires 2026-11-24 is not in the future')
  })
})

describe('keys --expires at a date-time', () => {
  it('reads one without an offset as UTC, whatever the time zone of the machine running the CLI', () => {
    const zone = process.env.TZ
    try {
      for (const timeZone of ['UTC', 'Asia/Tokyo', 'America/Los_Angeles']) {
        process.env.TZ = timeZone
        expect(parseExpires('2026-12-31T18:00', now)).toEqual({ at: new Date('2026-12-31T18:00:00Z') })
      }
    } finally {
      // Assigned undefined, the variable would hold the string "undefined" (read as UTC) for every
      // later file in this worker.
      if (zone === undefined) delete process.env.TZ
      else process.env.TZ = zone
    }
    expect(parseExpires('2026-12-31T18:00+09:00', now)).toEqual({ at: new Date('2026-12-31T09:00:00Z') })
  })
})

describe('keys command line', () => {
  it('takes --json before the command as after it', () => {
    expect(parseCommand(['--json', 'list'])).toEqual(parseCommand(['list', '--json']))
    expect(parseCommand(['--json', 'show', 'key_abc'])).toEqual({ name: 'show', id: 'key_abc', json: true })
  })

  it('says no command was given when --json is all there is, not that --json is an unknown command', () => {
    expect(() => parseCommand(['--json'])).toThrow('no command given')
    expect(() => parseCommand(['--json', '--json'])).toThrow('no command given')
  })

  it('answers --help after a command with the usage, not with what the command lacks', () => {
    expect(parseCommand(['create', '--help'])).toEqual({ name: 'help' })
    expect(parseCommand(['set-limits', 'key_abc', '-h'])).toEqual({ name: 'help' })
  })

  it('lists each key\'s expiry in the table, never for a key that does not expire', () => {
    const record = keyRecord({ id: 'key_expiring1', name: 'expiring', expiresAt: new Date('2026-12-31T18:00:00Z') })
    const [header, expiring, lasting] = keyTable([record, keyRecord({ id: 'key_lasting01' })], undefined, new Date('2026-06-01T00:00:00Z'), () => null)
      .join('')
      .split('\n')
    expect(header).toMatch(/\bCREATED \(UTC\)\s+EXPIRES \(UTC\)$/)
    expect(expiring).toMatch(/2026-01-01 00:00\s+2026-12-31 18:00$/)
    expect(lasting).toMatch(/2026-01-01 00:00\s+never$/)
  })

  it('refuses an option given twice instead of keeping the last (create --plan free --plan pro made a pro key)', () => {
    expect(() => parseCommand(['create', '--plan', 'free', '--plan', 'pro'])).toThrow('create: --plan given more than once')
    expect(() => parseCommand(['set-limits', 'key_abc', '--per-minute', '5', '--per-day', '9', '--per-minute=7'])).toThrow('set-limits: --per-minute given more than once')
    expect(parseCommand(['list', '--json', '--json'])).toEqual({ name: 'list', json: true })
  })

  // Node's own message called `--per-minute -5` ambiguous and advised `--per-minute=-5`, refused next.
  it('refuses a negative limit given with a space as it refuses one given with =, naming the numbers it takes', () => {
    const message = '--per-minute must be a whole number from 1 to 2147483647, got "-5"'
    expect(() => parseCommand(['set-limits', 'key_abc', '--per-minute=-5', '--per-day', '100'])).toThrow(message)
    expect(() => parseCommand(['set-limits', 'key_abc', '--per-minute', '-5', '--per-day', '100'])).toThrow(message)
    expect(() => parseCommand(['create', '--plan', 'enterprise', '--per-minute', '10', '--per-day', '-1'])).toThrow(
      '--per-day must be a whole number from 1 to 2147483647, got "-1"',
    )
    expect(() => parseCommand(['set-plan', 'key_abc', 'pro', '--per-minute', '--per-day', '100'])).toThrow(
      '--per-minute must be a whole number from 1 to 2147483647, got "--per-day"',
    )
  })

  it('refuses set-limits with --clear and custom limits together', () => {
    expect(() => parseCommand(['set-limits', 'key_abc', '--clear', '--per-minute', '10', '--per-day', '100'])).toThrow(
      'set-limits takes either --clear or --per-minute and --per-day, not both',
    )
  })

  it('checks the --name of create as it is stored: trimmed, no control characters', () => {
    expect(parseCommand(['create', '--plan', 'free', '--name', '  billing  '])).toMatchObject({ keyName: 'billing' })
    expect(() => parseCommand(['create', '--plan', 'free', '--name', 'ops\u001b[2J'])).toThrow('--name must not contain control characters')
  })

  it('takes for a key the start of one opening a word after other characters, or half a key glued to a word', () => {
    const looksLikeKey = 'an argument looks like an API key'
    expect(() => parseCommand(['create', '--plan', 'free', '--name=aas_Ab3dE'])).toThrow(looksLikeKey)
    expect(() => parseCommand(['show', `xaas_${'a1B2c3D4e5'.repeat(2).slice(0, 19)}`])).toThrow(looksLikeKey)
    expect(parseCommand(['create', '--plan', 'free', '--name', `saas_${'a'.repeat(18)}`])).toMatchObject({ keyName: `saas_${'a'.repeat(18)}` })
  })
})

describe('keys --per-minute and --per-day', () => {
  it('takes both, a day limit equal to the minute limit included', () => {
    expect(parseLimits('100', '100')).toEqual({ perMinute: 100, perDay: 100 })
    expect(parseLimits('1', '2147483647')).toEqual({ perMinute: 1, perDay: 2_147_483_647 })
    expect(parseLimits(undefined, undefined)).toBeUndefined()
  })

  it.each([
    [['0', '100'], '--per-minute must be a whole number from 1 to 2147483647, got "0"'],
    [['10', '2147483648'], '--per-day must be a whole number from 1 to 2147483647, got "2147483648"'],
    [['1.5', '100'], '--per-minute must be a whole number from 1 to 2147483647, got "1.5"'],
    [['100', '99'], '--per-day (99) must be at least --per-minute (100)'],
    [['100', undefined], '--per-minute and --per-day go together: give both'],
  ] as const)('refuses %j, saying why', ([perMinute, perDay], message) => {
    expect(() => parseLimits(perMinute, perDay)).toThrow(message)
  })
})

describe('keys --name', () => {
  it('takes a name trimmed, and refuses a blank one, one over 200 characters or one with control characters', () => {
    expect(parseName('  acme  ')).toBe('acme')
    expect(parseName('x'.repeat(200))).toBe('x'.repeat(200))
    expect(() => parseName('   ')).toThrow('--name must be 1 to 200 characters, got 0')
    expect(() => parseName('x'.repeat(201))).toThrow('--name must be 1 to 200 characters, got 201')
    expect(() => parseName('evil\u001b[2Jname')).toThrow('--name must not contain control characters')
    // C1: CSI and OSC as one character each, which terminals obey in UTF-8 too.
    expect(() => parseName('acme\u009b2J\u009d0;pwned\u009c')).toThrow('--name must not contain control characters (C0, DEL or C1)')
    expect(() => parseName('acme\u202erevoked')).toThrow('--name must not hold bidirectional override')
    expect(() => parseName('acme\u2028revoked')).toThrow('--name must not hold a line or paragraph separator (U+2028, U+2029)')
  })

  it('shows a name or plan written by hand in psql with what a terminal obeys escaped, in list and show', () => {
    const record = keyRecord({ name: 'acme\u009b2J\u001b]0;pwned\u0007\u202erevoked', plan: 'free\u2028pro' })
    // eslint-disable-next-line no-control-regex -- what must not reach the terminal
    const obeyed = /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069\u2028\u2029]/
    const table = keyTable([record], undefined, new Date(), () => null).join('')
    const details = keyDetails(record, undefined, new Date(), null)
    for (const text of [table, details]) expect(text.replace(/\n/g, '')).not.toMatch(obeyed)
    expect(details).toContain('acme\\u009b2J\\u001b]0;pwned\\u0007\\u202erevoked')
    expect(details).toContain('free\\u2028pro')
    // The table keeps 32 characters of a name.
    expect(table).toContain('acme\\u009b2J\\u001b]0;pwned')
    expect(table.trimEnd().split('\n')).toHaveLength(2)
  })

  it('counts characters as the database does: 200 emoji are a name, 201 are not', () => {
    expect(parseName('🐶'.repeat(200))).toBe('🐶'.repeat(200))
    expect(() => parseName('🐶'.repeat(201))).toThrow('--name must be 1 to 200 characters, got 201')
  })
})
