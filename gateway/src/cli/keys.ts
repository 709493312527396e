/**
 * `npm run keys -- <command> …`: the operator CLI for API keys (see USAGE in args.ts).
 * Exit status 0 done, 1 failed, 2 bad arguments. Results go to stdout, errors to stderr, one line
 * each (a bad argument adds a pointer to --help); with --json stdout holds exactly one JSON
 * object or nothing.
 */
import type { Command } from './args.ts'
import { runKeys } from './run.ts'

/**
 * stdout's reader gone (`keys list | head`, a pager quit, a closed terminal): EPIPE, which Node
 * raised as an uncaught error with its stack trace. Reading commands stop quietly, as Unix tools
 * do; a command that changed something says once that its result was not written, exit 1.
 */
const READ_ONLY = new Set<Command['name']>(['list', 'show', 'help'])
let stdoutGone = false
process.stdout.on('error', (error: NodeJS.ErrnoException) => {
  if (error.code !== 'EPIPE') throw error
  stdoutGone = true
})
process.stderr.on('error', () => undefined)

const { code, ran } = await runKeys(process.argv.slice(2), {
  out: (text) => void (stdoutGone || process.stdout.write(text)),
  err: (text) => void process.stderr.write(text),
})
// The EPIPE of the last write is reported on a later turn.
await new Promise((resolve) => setImmediate(resolve))
if (stdoutGone && code === 0 && ran !== undefined && !READ_ONLY.has(ran)) {
  process.stderr.write(
    `error: stdout was closed before the result was written; ${ran} was done` +
      (ran === 'create' ? ', but the new key is lost with it: revoke it (`npm run keys -- list` shows it by its name) and create another' : '') +
      '\n',
  )
  process.exitCode = 1
} else {
  process.exitCode = code
}
