import { parseArgs } from 'node:util'
import { KEY_PREFIX } from '../keys/apiKeyFormat.ts'
import { UsageError } from './errors.ts'
import { parseExpires, parseLimit, parseLimits, parseName, type KeyExpiry, type Limits } from './values.ts'

/** The name of a key created without --name (DESIGN's example creates one so). */
export const UNNAMED = 'unnamed'

export const USAGE = `Usage: npm run keys -- <command> [options]

Commands:
  create --plan <plan> [--name <name>] [--per-minute N --per-day N] [--expires <when>]
                          create a key and print it; it is shown this once, never again;
                          --name says who or what it is for (default "unnamed")
  list                    every key: id, prefix, name, plan, limits, state (or ban), created,
                          expires
  show <id>               one key, with its ban if it is banned
  revoke <id>             revoke a key; every running gateway refuses it within 2 s
  unban <id>              lift a key's ban on every running gateway within 2 s and clear
                          its strikes (the ban-ladder step it reached is kept for 24 h);
                          says "pending" if no gateway could apply it yet (it is retried)
  set-plan <id> <plan> [--per-minute N --per-day N]
                          move a key to another plan (custom limits it has are kept)
  set-limits <id> --per-minute N --per-day N
                          give a key custom limits in place of its plan's
  set-limits <id> --clear return a key to its plan's limits

Options:
  --per-minute N, --per-day N
                          custom limits, given together, per-day at least per-minute;
                          required by a plan whose limits are "custom" (enterprise)
  --expires <when>        a duration (90s, 30m, 12h, 30d, 8w) or an ISO date (2026-12-31,
                          2026-12-31T18:00:00Z); without it the key does not expire
  --json                  print exactly one JSON object on stdout and nothing else
  -h, --help              this text

Plans come from the gateway config (GATEWAY_CONFIG, default config/gateway.yaml).
Database: DATABASE_URL, or else the embedded database of a running \`npm start\`
(found through <DATA_DIR or ./data>/embedded-postgres.json).
Exit status: 0 done, 1 failed (unknown key id, revoked key, no database, ...), 2 bad arguments.
`

/** What follows a bad argument's message in place of the whole usage. */
export const HELP_HINT = '`npm run keys -- --help` lists the commands and their options.\n'

export type Command =
  | { name: 'help' }
  | { name: 'create'; plan: string; keyName: string; limits?: Limits; expires: KeyExpiry | null; json: boolean }
  | { name: 'list'; json: boolean }
  | { name: 'show' | 'revoke' | 'unban'; id: string; json: boolean }
  | { name: 'set-plan'; id: string; plan: string; limits?: Limits; json: boolean }
  | { name: 'set-limits'; id: string; limits: Limits | null; json: boolean }

type OptionSpec = Record<string, { type: 'string' | 'boolean'; short?: string }>

const COMMON: OptionSpec = { json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } }
const LIMITS: OptionSpec = { 'per-minute': { type: 'string' }, 'per-day': { type: 'string' } }

const COMMANDS: Record<string, { positionals: string[]; options: OptionSpec }> = {
  create: { positionals: [], options: { plan: { type: 'string' }, name: { type: 'string' }, expires: { type: 'string' }, ...LIMITS } },
  list: { positionals: [], options: {} },
  show: { positionals: ['id'], options: {} },
  revoke: { positionals: ['id'], options: {} },
  unban: { positionals: ['id'], options: {} },
  'set-plan': { positionals: ['id', 'plan'], options: LIMITS },
  'set-limits': { positionals: ['id'], options: { ...LIMITS, clear: { type: 'boolean' } } },
}

/**
 * An argument holding an API key or the start of one: `aas_` opening a word, or followed by a run
 * of base62 characters as long as half a key's, wherever it is. Not a name that merely contains
 * the four letters (`saas_billing`, `paas_team`), which was refused as a key.
 */
const LOOKS_LIKE_KEY = new RegExp(`(?:^|[^0-9A-Za-z])${KEY_PREFIX}|${KEY_PREFIX}[0-9A-Za-z]{19,}`)

/** Turns the command line (after `npm run keys --`) into a Command; bad arguments throw UsageError. */
export function parseCommand(argv: string[], now = new Date()): Command {
  // Before anything can echo an argument back: an API key is a secret and is never repeated.
  if (argv.some((argument) => LOOKS_LIKE_KEY.test(argument))) {
    throw new UsageError(
      `an argument looks like an API key (${KEY_PREFIX}…), which is not repeated here: the commands take key ids ` +
        '(key_…), never keys. `npm run keys -- list` shows each key\'s id and prefix.',
    )
  }
  // `--json` may come before the command too (`keys --json list`), as with most CLIs.
  const first = argv.findIndex((argument) => argument !== '--json')
  const [name, ...rest] = first === -1 ? [] : [...argv.slice(first), ...argv.slice(0, first)]
  if (name === undefined) throw new UsageError('no command given', true)
  if (name === 'help' || name === '--help' || name === '-h') return { name: 'help' }
  const spec = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined
  if (!spec) throw new UsageError(`unknown command "${name}"`)

  let parsed: { values: Record<string, string | boolean | undefined>; positionals: string[]; tokens: { kind: string; name?: string; value?: string }[] }
  try {
    parsed = parseArgs({ args: rest, options: { ...COMMON, ...spec.options }, strict: true, allowPositionals: true, tokens: true })
  } catch (error) {
    // `--per-minute -5`: Node calls the value ambiguous and advises `--per-minute=-5`, which is
    // only refused next. The option's own message says at once what it takes.
    const ambiguous = /^Option '--([\w-]+)' argument is ambiguous/.exec((error as Error).message)
    const option = ambiguous?.[1]
    if ((error as NodeJS.ErrnoException).code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE' && option !== undefined && Object.hasOwn(LIMITS, option)) {
      const at = rest.findIndex((argument, index) => argument === `--${option}` && rest[index + 1]?.startsWith('-'))
      if (at !== -1) parseLimit(option, rest[at + 1]!)
    }
    // Node's advice for an unknown option, to pass it as a positional after `--`, fits no command
    // here (an id or a plan never starts with '-') and only led to a second error.
    const reason = (error as Error).message.replace(/\s*\n\s*/g, ' ').replace(/\. To specify a positional argument .*$/, '')
    throw new UsageError(`${name}: ${reason}`)
  }
  const { values, positionals } = parsed
  if (values.help) return { name: 'help' }
  // parseArgs keeps the last of a repeated option: `create --plan free --plan pro` made a pro key.
  const given = parsed.tokens.filter((token) => token.kind === 'option' && token.value !== undefined).map((token) => token.name!)
  const repeated = given.find((option, index) => given.indexOf(option) !== index)
  if (repeated !== undefined) throw new UsageError(`${name}: --${repeated} given more than once`)
  if (positionals.length !== spec.positionals.length) {
    const expected = spec.positionals.length === 0 ? 'no arguments' : spec.positionals.map((p) => `<${p}>`).join(' ')
    throw new UsageError(`${name} takes ${expected}, got ${positionals.length === 0 ? 'none' : positionals.join(' ')}`)
  }
  const text = (option: string) => values[option] as string | undefined
  const json = values.json === true
  const [id = '', second = ''] = positionals
  const limits = parseLimits(text('per-minute'), text('per-day'))

  switch (name) {
    case 'create': {
      const plan = text('plan')
      const keyName = text('name')
      if (plan === undefined) throw new UsageError('create needs --plan <plan>')
      const expires = text('expires')
      return {
        name,
        plan,
        keyName: keyName === undefined ? UNNAMED : parseName(keyName),
        ...(limits ? { limits } : {}),
        expires: expires === undefined ? null : parseExpires(expires, now),
        json,
      }
    }
    case 'list':
      return { name, json }
    case 'show':
    case 'revoke':
    case 'unban':
      return { name, id, json }
    case 'set-plan':
      return { name, id, plan: second, ...(limits ? { limits } : {}), json }
    default: {
      if (values.clear && limits) throw new UsageError('set-limits takes either --clear or --per-minute and --per-day, not both')
      if (!values.clear && !limits) throw new UsageError('set-limits needs --per-minute N --per-day N, or --clear')
      return { name: 'set-limits', id, limits: limits ?? null, json }
    }
  }
}
