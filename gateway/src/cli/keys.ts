/**
 * `npm run keys -- <command> …`: the operator CLI for API keys (see USAGE in args.ts).
 * Exit status 0 done, 1 failed, 2 bad arguments. Results go to stdout, errors to stderr, one line
 * each (a bad argument adds a pointer to --help); with --json stdout holds exactly one JSON
 * object or nothing.
 */
import { escapeForDisplay } from '../../../common/src/text/displaySafety.ts'
import { HELP_HINT, USAGE, parseCommand } from './args.ts'
import type { Output } from './commands.ts'
import { CliError, UsageError, explain } from './errors.ts'

async function main(argv: string[], output: Output): Promise<number> {
  try {
    const command = parseCommand(argv)
    if (command.name === 'help') {
      output.out(USAGE)
      return 0
    }
    // Loaded only once the arguments are known to be good: help and usage errors stay instant.
    const { execute } = await import('./execute.ts')
    await execute(command, output)
    return 0
  } catch (error) {
    if (error instanceof UsageError) {
      // The 30 lines of usage after every slip buried the one line saying what was wrong.
      output.err(`error: ${escapeForDisplay(error.message)}\n${error.withUsage ? `\n${USAGE}` : HELP_HINT}`)
      return 2
    }
    if (error instanceof CliError) {
      output.err(`error: ${escapeForDisplay(error.message)}\n`)
      return 1
    }
    // A Postgres error carries a SQLSTATE code and is not a defect here; anything else may be one.
    const operational = typeof (error as { code?: unknown } | null)?.code === 'string' || !(error instanceof Error)
    output.err(`error: ${operational ? explain(error) : (error.stack ?? error.message)}\n`)
    return 1
  }
}

process.exitCode = await main(process.argv.slice(2), {
  out: (text) => void process.stdout.write(text),
  err: (text) => void process.stderr.write(text),
})
