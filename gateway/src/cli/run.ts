import { escapeForDisplay } from '../../../common/src/text/displaySafety.ts'
import { HELP_HINT, USAGE, parseCommand } from './args.ts'
import type { Command } from './args.ts'
import type { Output } from './commands.ts'
import { CliError, UsageError, explain } from './errors.ts'

/**
 * The keys CLI's work for one command line, its output handed to `output`: the exit status, and
 * the command it ran once its arguments parsed. No process state: keys.ts is the process around it.
 */
export async function runKeys(argv: string[], output: Output, env: NodeJS.ProcessEnv = process.env): Promise<{ code: number; ran?: Command['name'] }> {
  let ran: Command['name'] | undefined
  try {
    const command = parseCommand(argv)
    ran = command.name
    if (command.name === 'help') {
      output.out(USAGE)
      return { code: 0, ran }
    }
    // A new key is shown only in what create prints: into /dev/null it would be lost unseen, and
    // the write succeeds, so nothing would say so afterwards. Refused before any key exists.
    if (command.name === 'create' && output.outDiscarded) {
      output.err(
        'error: stdout is closed or /dev/null, so the new key would be lost: no key was created. ' +
          'Send stdout to a file (`> key.txt`) or to a script that reads it (`--json`).\n',
      )
      return { code: 2, ran }
    }
    // Loaded only once the arguments are known to be good: help and usage errors stay instant.
    const { execute } = await import('./execute.ts')
    await execute(command, output, env)
    return { code: 0, ran }
  } catch (error) {
    if (error instanceof UsageError) {
      // The 30 lines of usage after every slip buried the one line saying what was wrong.
      output.err(`error: ${escapeForDisplay(error.message)}\n${error.withUsage ? `\n${USAGE}` : HELP_HINT}`)
      return { code: 2, ran }
    }
    if (error instanceof CliError) {
      output.err(`error: ${escapeForDisplay(error.message)}\n`)
      return { code: 1, ran }
    }
    // A Postgres error carries a SQLSTATE code and is not a defect here; anything else may be one.
    const operational = typeof (error as { code?: unknown } | null)?.code === 'string' || !(error instanceof Error)
    output.err(`error: ${operational ? explain(error) : (error.stack ?? error.message)}\n`)
    return { code: 1, ran }
  }
}

