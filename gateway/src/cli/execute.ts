import type pg from 'pg'
import { migrate } from '../../../common/src/database/migrate.ts'
import { QUERY_CANCELED, createPool, endPool, isDatabaseUnavailable } from '../../../common/src/database/pool.ts'
import { CLOSE_DEPENDENCY_MILLIS } from '../../../common/src/lifecycle/shutdown.ts'
import { describeRefusal } from '../../../common/src/database/privileges.ts'
import { UNPARSABLE_DATABASE_URL, unparsableDatabaseUrl } from '../../../common/src/database/waitForPostgres.ts'
import { ConfigError, DEFAULT_CONFIG_PATH, loadGatewayConfig } from '../config/loadConfig.ts'
import { createKeyRepository, type KeyRepository } from '../keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS, KEYS_CLI_POSTGRES_NEEDS } from '../migrations.ts'
import type { Command } from './args.ts'
import { checkCommand, runCommand, type Output } from './commands.ts'
import { printableUrl } from '../../../common/src/database/printableUrl.ts'
import { locateDatabase, type DatabaseLocation } from './database.ts'
import { CliError, explain } from './errors.ts'
import type { Plans } from './format.ts'

/** The config's plans. Revoking and unbanning must work even while someone is mid-way through editing the config. */
function loadPlans(command: Command, output: Output, env: NodeJS.ProcessEnv): Plans | undefined {
  try {
    // The plans only: the gateway's variables (ports, Redis, certificate files) are the gateway's
    // business, and one set wrong in this shell stopped every command with a stack trace. Nor its
    // certificate files (its key often readable by the gateway only).
    return loadGatewayConfig(env.GATEWAY_CONFIG || DEFAULT_CONFIG_PATH, {}, undefined, { tlsFiles: false }).plans
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error
    // One line: printed escaped, the message's line breaks showed as \u000a.
    if (command.name !== 'revoke' && command.name !== 'unban') throw new CliError(`invalid gateway config: ${error.problems.join('; ')}`)
    output.err(`warning: ${error.message}\n(going ahead: ${command.name} needs no plan)\n`)
    return undefined
  }
}

/** How long a statement of the CLI may take, a wait for a lock included. */
const STATEMENT_TIMEOUT_SECONDS = 5

/** Postgres's five-character error code (every one holds a digit; Node's EPIPE, EPERM … do not). */
const SQLSTATE = /^(?=.*\d)[0-9A-Z]{5}$/

/** The commands that change something: a statement of theirs cut off changed nothing, and says so. */
const CHANGES = new Set(['create', 'revoke', 'set-plan', 'set-limits', 'unban'])

/** Whether the command's change has been made (committed): what a failure after it must not deny. */
interface Progress {
  changed: boolean
}

/** The repository, noting in `progress` when one of its changes has been made. */
function noteChanges(repository: KeyRepository, progress: Progress): KeyRepository {
  const noted =
    <A extends unknown[], R>(change: (...args: A) => Promise<R>) =>
    async (...args: A): Promise<R> => {
      const result = await change(...args)
      if (result !== undefined && result !== null) progress.changed = true
      return result
    }
  const { create, revoke, setPlan, setLimits, requestUnban } = repository
  return { ...repository, create: noted(create), revoke: noted(revoke), setPlan: noted(setPlan), setLimits: noted(setLimits), requestUnban: noted(requestUnban) }
}

async function databaseError(error: unknown, location: DatabaseLocation, pool: pg.Pool, command?: Command, progress?: Progress): Promise<unknown> {
  if (error instanceof CliError) return error
  // pg could not parse the URL: no Postgres was asked anything, and the URL cannot be printed.
  if (unparsableDatabaseUrl(error)) return new CliError(`cannot use Postgres at ${location.source}: ${UNPARSABLE_DATABASE_URL}`)
  const where = location.source === 'DATABASE_URL' ? `DATABASE_URL (${printableUrl(location.url)})` : location.source
  // A privilege, the login or an object taken from the role: said with the GRANT that mends it.
  const refused = await describeRefusal(pool, KEYS_CLI_POSTGRES_NEEDS, error)
  if (refused !== undefined) return new CliError(`${refused} (Postgres at ${where})`)
  const code = typeof error === 'object' && error !== null ? (error as { code?: unknown }).code : undefined
  // A change that waited on a lock past the timeout (another transaction on the key's row or its
  // table) was rolled back: said plainly, as "did not finish" left the operator to guess.
  if (code === QUERY_CANCELED && command !== undefined && CHANGES.has(command.name)) {
    // Cut off after the change had committed (reading its result back: a ban record, an unban's
    // progress, behind a lock on their tables), it was done all the same.
    if (progress?.changed) {
      return new CliError(
        `${command.name} was done, but reading its result back took over ${STATEMENT_TIMEOUT_SECONDS} s at ${where}; ` +
          '`npm run keys -- show <id>` shows the key as it is now',
      )
    }
    return new CliError(
      `${command.name} was not done: Postgres did not finish its statement within ${STATEMENT_TIMEOUT_SECONDS} s at ${where}, ` +
        'as when another transaction holds the key\'s row or its table; nothing was changed, run it again',
    )
  }
  // 25006 counts as unavailable (a 503 for the services), but this Postgres was reached.
  const what =
    code === QUERY_CANCELED
      ? 'Postgres did not finish a statement within its timeout'
      : code === '25006'
        ? 'Postgres takes no writes for now (read-only)'
        : isDatabaseUnavailable(error)
          ? 'cannot reach Postgres'
          : // Only a statement Postgres answered carries a SQLSTATE; anything else failed before one ran.
            typeof code === 'string' && SQLSTATE.test(code)
            ? 'cannot prepare the gateway schema'
            : 'cannot use Postgres'
  return new CliError(`${what} at ${where}: ${explain(error)}`)
}

/**
 * Everything after argument parsing: config, database, migrations, the command. Kept apart from
 * the entry point so `--help` and bad arguments answer without loading pg, ajv and the schema.
 */
export async function execute(command: Command, output: Output, env: NodeJS.ProcessEnv = process.env): Promise<void> {
  const plans = loadPlans(command, output, env)
  checkCommand(command, plans)
  const location = await locateDatabase(env)
  const progress: Progress = { changed: false }
  const pool = createPool({
    connectionString: location.url,
    applicationName: 'keys-cli',
    max: 2,
    connectionTimeoutMillis: 5_000,
    statementTimeoutMillis: STATEMENT_TIMEOUT_SECONDS * 1_000,
  })
  try {
    try {
      await migrate(pool, GATEWAY_MIGRATIONS)
    } catch (error) {
      throw await databaseError(error, location, pool)
    }
    await runCommand(command, { repository: noteChanges(createKeyRepository(pool), progress), plans, output })
  } catch (error) {
    throw isDatabaseUnavailable(error) ? await databaseError(error, location, pool, command, progress) : error
  } finally {
    await endPool(pool, CLOSE_DEPENDENCY_MILLIS)
  }
}
