import { setTimeout as sleep } from 'node:timers/promises'
import { escapeForDisplay } from '../../../common/src/text/displaySafety.ts'
import { ExpiryPassedError, type ApiKeyRecord, type KeyRepository } from '../keys/keyRepository.ts'
import type { Command } from './args.ts'
import { CliError, UsageError } from './errors.ts'
import { describeLimits, describeTime, hasCustomLimits, keyDetails, keyJson, keyTable, type Plans } from './format.ts'

export interface Output {
  out(text: string): void
  err(text: string): void
  /** What `out` writes is thrown away unread: stdout is /dev/null (as Node makes a closed one). */
  outDiscarded?: boolean
}

export interface CommandDeps {
  repository: Pick<KeyRepository, 'create' | 'findById' | 'list' | 'revoke' | 'setPlan' | 'setLimits' | 'requestUnban' | 'isUnbanApplied' | 'activeBans' | 'now'>
  /** The gateway config's plans; undefined only for `revoke` when the config cannot be read. */
  plans: Plans | undefined
  output: Output
  now?: () => Date
}

/**
 * How long `unban` waits for a running gateway to apply it before saying it is pending: they do
 * within 2 s (at once on NOTIFY, else at their next read of the log).
 */
const UNBAN_WAIT_MILLIS = 3_000

async function appliedWithin(isApplied: () => Promise<boolean>, millis: number): Promise<boolean> {
  const until = Date.now() + millis
  for (;;) {
    if (await isApplied()) return true
    if (Date.now() >= until) return false
    await sleep(100)
  }
}

type Plan = Plans[string]
const isCustomPlan = (plan: Plan) => plan.perMinute === 'custom' || plan.perDay === 'custom'

function requirePlan(plans: Plans | undefined, name: string): Plan {
  if (!plans) throw new CliError('the gateway config is needed for this command')
  const plan = Object.hasOwn(plans, name) ? plans[name] : undefined
  if (!plan) {
    throw new UsageError(`unknown plan "${name}"; the plans in the gateway config are: ${Object.keys(plans).join(', ')}`)
  }
  return plan
}

const needsLimits = (planName: string) =>
  new UsageError(`plan "${planName}" has custom limits: give the key --per-minute N and --per-day N`)

/** Checks what can be checked without the database, so bad arguments fail before connecting. */
export function checkCommand(command: Command, plans: Plans | undefined): void {
  if (command.name === 'create') {
    if (isCustomPlan(requirePlan(plans, command.plan)) && !command.limits) throw needsLimits(command.plan)
  } else if (command.name === 'set-plan') {
    requirePlan(plans, command.plan)
  }
}

async function existing(deps: CommandDeps, id: string): Promise<ApiKeyRecord> {
  const record = await deps.repository.findById(id)
  if (!record) throw new CliError(`no API key with id "${id}" (\`npm run keys -- list\` shows the ids)`)
  return record
}

/**
 * set-plan, set-limits and unban on a revoked or expired key: refused. Such a key is refused by
 * every gateway and cannot be brought back, so changing it only hides a mistake (usually the
 * wrong id). Expired by the database's clock (`now`), as the gateways judge it.
 */
function live(record: ApiKeyRecord, now: Date): ApiKeyRecord {
  const gone =
    record.revokedAt !== null
      ? `is revoked (since ${describeTime(record.revokedAt)}): a revoked key`
      : record.expiresAt !== null && record.expiresAt <= now
        ? `expired ${describeTime(record.expiresAt)}: an expired key`
        : undefined
  if (gone !== undefined) {
    throw new CliError(`API key ${record.id} ${gone} cannot be changed or unbanned. Check the id (\`npm run keys -- list\`), or create a new key.`)
  }
  return record
}

/**
 * Why a guarded change changed nothing, from the key as it is now: gone, revoked or expired since
 * it was read, or else `otherwise` (a plan that needs limits, which a concurrent change took).
 */
async function whyUnchanged(deps: CommandDeps, id: string, otherwise: () => Error): Promise<never> {
  live(await existing(deps, id), await deps.repository.now())
  throw otherwise()
}

/** A key that vanished between two statements (deleted by hand): same answer as an unknown id. */
function present(record: ApiKeyRecord | undefined, id: string): ApiKeyRecord {
  if (!record) throw new CliError(`no API key with id "${id}"`)
  return record
}

export async function runCommand(command: Command, deps: CommandDeps): Promise<void> {
  const { output, plans, repository } = deps
  // Whether a key has expired is the database's say, as on the gateways, not the CLI machine's clock.
  const now = deps.now?.() ?? (command.name === 'help' ? new Date() : await repository.now())
  const report = async (record: ApiKeyRecord, json: boolean, headline: string, extra: Record<string, unknown> = {}) => {
    const ban = (await repository.activeBans([record.id])).get(record.id) ?? null
    if (json) output.out(`${JSON.stringify({ ...keyJson(record, plans, now, ban), ...extra })}\n`)
    else output.out(`${headline}\n${keyDetails(record, plans, now, ban)}`)
  }
  /** Remarks that are not the result: stdout for a person, stderr when stdout is JSON. */
  const note = (json: boolean, text: string) => (json ? output.err(`note: ${text}\n`) : output.out(`\nNote: ${text}\n`))
  checkCommand(command, plans)

  switch (command.name) {
    case 'help':
      return
    case 'create': {
      const { record, key } = await repository
        .create({
          name: command.keyName,
          plan: command.plan,
          perMinute: command.limits?.perMinute ?? null,
          perDay: command.limits?.perDay ?? null,
          ...(command.expires === null ? {} : 'at' in command.expires ? { expiresAt: command.expires.at } : { expiresInMillis: command.expires.afterMillis }),
          expiryInFuture: true,
        })
        .catch((error: unknown) => {
          if (!(error instanceof ExpiryPassedError) || command.expires === null || !('at' in command.expires)) throw error
          throw new CliError(`--expires ${command.expires.at.toISOString()} is not in the future by the database's clock (${now.toISOString()} there): no key was created`)
        })
      if (command.json) {
        const { id, ...rest } = keyJson(record, plans, now, null)
        output.out(`${JSON.stringify({ id, key, ...rest })}\n`)
        return
      }
      output.out(
        `Created API key ${record.id} "${escapeForDisplay(record.name)}" on plan ${escapeForDisplay(record.plan)} (${describeLimits(record, plans)})` +
          `${record.expiresAt === null ? '' : `, expiring ${describeTime(record.expiresAt)}`}.\n\n` +
          `  ${key}\n\n` +
          'Store this key now: it is shown only this once and cannot be shown again (only its hash is kept).\n',
      )
      return
    }
    case 'list': {
      const bans = await repository.activeBans()
      const banOf = (record: ApiKeyRecord) => bans.get(record.id) ?? null
      // Printed once every page is read: a failure part-way leaves stdout empty, as it promises.
      // Kept as one piece per page, not one string: a million keys would pass V8's longest string.
      const pieces: string[] = []
      const records: ApiKeyRecord[] = []
      for await (const page of repository.list()) {
        if (command.json) pieces.push(page.map((record) => JSON.stringify(keyJson(record, plans, now, banOf(record)))).join(','))
        else records.push(...page)
      }
      if (command.json) {
        output.out('{"keys":[')
        pieces.forEach((piece, index) => output.out(index === 0 ? piece : `,${piece}`))
        output.out(']}\n')
      } else if (records.length === 0) output.out('No API keys yet. Create one: npm run keys -- create --plan <plan> --name <name>\n')
      else for (const lines of keyTable(records, plans, now, banOf)) output.out(lines)
      return
    }
    case 'show':
      return report(await existing(deps, command.id), command.json, `API key ${command.id}`)
    case 'revoke': {
      const before = await existing(deps, command.id)
      const record = present(await repository.revoke(command.id), command.id)
      const headline = before.revokedAt
        ? `API key ${record.id} was already revoked.`
        : `Revoked API key ${record.id}: every running gateway refuses it within 2 s.`
      return report(record, command.json, headline)
    }
    case 'unban': {
      const record = live(await existing(deps, command.id), now)
      const recordedBan = (await repository.activeBans([record.id])).has(record.id)
      const changeId = await repository.requestUnban(command.id)
      if (changeId === null) present(undefined, command.id)
      const applied = await appliedWithin(() => repository.isUnbanApplied(changeId as number), UNBAN_WAIT_MILLIS)
      // Nothing recorded is no proof of no ban (one set while gateways ran without Redis is not
      // recorded): the store was asked to lift one either way, and the key's strikes are cleared.
      const headline = !applied
        ? `Unban of API key ${record.id} requested, not applied yet: no gateway lifted the ban within ${UNBAN_WAIT_MILLIS / 1_000} s ` +
          '(none is running, its Redis is unreachable, or only gateways of an earlier version are running, which do not say so). ' +
          'Every gateway retries pending unbans at start and every 2 s, for a day.'
        : recordedBan
          ? `Unbanned API key ${record.id}: a gateway cleared its ban and strikes in the rate-limit store (one restarted since the ban, as npm start's in-process store is at each start, held none by then), and every running gateway stops answering banned within 2 s.`
          : `API key ${record.id} had no ban on record; a gateway cleared its strikes (and any ban) in the rate-limit store.`
      return report(record, command.json, headline, { unban: applied ? 'applied' : 'pending' })
    }
    case 'set-plan': {
      const plan = requirePlan(plans, command.plan)
      const before = live(await existing(deps, command.id), now)
      const hasBoth = before.perMinute !== null && before.perDay !== null
      if (isCustomPlan(plan) && !command.limits && !hasBoth) throw needsLimits(command.plan)
      // One statement, its guards in it: limits and plan change together, never a key a revoke or a
      // `set-limits --clear` changed meanwhile.
      const changed = await repository.setPlan(command.id, command.plan, {
        ...(command.limits ? { limits: command.limits } : {}),
        needsLimits: isCustomPlan(plan),
      })
      const record =
        changed ??
        (await whyUnchanged(
          deps,
          command.id,
          () => new CliError(`API key ${command.id}'s own limits were cleared meanwhile, and plan "${command.plan}" has none of its own ("custom"): give set-plan --per-minute and --per-day`),
        ))
      await report(record, command.json, `API key ${record.id} is now on plan ${record.plan}.`)
      if (!isCustomPlan(plan) && !command.limits && hasCustomLimits(record)) {
        note(
          command.json,
          `the key keeps its custom limits, which take the place of plan ${record.plan}'s; ` +
            `\`npm run keys -- set-limits ${record.id} --clear\` gives it the plan's limits.`,
        )
      }
      return
    }
    case 'set-limits': {
      const before = live(await existing(deps, command.id), now)
      const plan = plans && Object.hasOwn(plans, before.plan) ? plans[before.plan] : undefined
      if (command.limits === null && plan && isCustomPlan(plan)) {
        throw new UsageError(
          `plan "${before.plan}" has no limits of its own ("custom"), so the key's limits cannot be cleared; ` +
            'move it to another plan first (set-plan)',
        )
      }
      const plansNeedingLimits = plans ? Object.keys(plans).filter((name) => isCustomPlan(plans[name]!)) : []
      const changed = await repository.setLimits(command.id, command.limits?.perMinute ?? null, command.limits?.perDay ?? null, plansNeedingLimits)
      const record =
        changed ??
        (await whyUnchanged(deps, command.id, () => new CliError(`API key ${command.id} was moved meanwhile to a plan with no limits of its own ("custom"): its limits cannot be cleared`)))
      // A plan the config lacks has no limits to return to: the gateways give such a key the strictest.
      const headline = command.limits
        ? `API key ${record.id} now has custom limits.`
        : plans && !Object.hasOwn(plans, record.plan)
          ? `API key ${record.id} now gets the strictest limits: its plan ${escapeForDisplay(record.plan)} is not in the gateway config.`
          : `API key ${record.id} now has the limits of plan ${escapeForDisplay(record.plan)}.`
      return report(record, command.json, headline)
    }
  }
}
