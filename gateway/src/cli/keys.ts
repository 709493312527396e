/**
 * `npm run keys -- <command> …`: the operator CLI for API keys (see USAGE in args.ts).
 * Exit status 0 done, 1 failed, 2 bad arguments. Results go to stdout, errors to stderr, one line
 * each (a bad argument adds a pointer to --help); with --json stdout holds exactly one JSON
 * object or nothing.
 */
import { fstatSync, statSync } from 'node:fs'
import type { Command } from './args.ts'
import { runKeys } from './run.ts'

/**
 * stdout's reader gone (`keys list | head`, a pager quit, a closed terminal): EPIPE, which Node
 * raised as an uncaught error with its stack trace. Reading commands stop quietly, as Unix tools
 * do; a command that changed something says once that its result was not written, exit 1. Any
 * other failure to write (a full disk or quota under `> key.json`, an I/O error) is said, exit 1,
 * whatever the command: what it printed is lost, not merely unwanted.
 */
const READ_ONLY = new Set<Command['name']>(['list', 'show', 'help'])
let stdoutFailure: NodeJS.ErrnoException | undefined
process.stdout.on('error', (error: NodeJS.ErrnoException) => {
  stdoutFailure ??= error
})
process.stderr.on('error', () => undefined)

/**
 * stdout is /dev/null: sent there (`> /dev/null`), or closed (`>&-`), which Node reopens on
 * /dev/null. Every write then succeeds, so no failure to write ever says that output was lost.
 */
function stdoutDiscarded(): boolean {
  try {
    const stdout = fstatSync(1)
    return stdout.isCharacterDevice() && stdout.rdev === statSync('/dev/null').rdev
  } catch {
    return false
  }
}

const { code, ran } = await runKeys(process.argv.slice(2), {
  out: (text) => void (stdoutFailure || process.stdout.write(text)),
  err: (text) => void process.stderr.write(text),
  outDiscarded: stdoutDiscarded(),
})
// The failure of the last write is reported on a later turn.
await new Promise((resolve) => setImmediate(resolve))
const readerGone = stdoutFailure?.code === 'EPIPE'
if (stdoutFailure && code === 0 && ran !== undefined && !(readerGone && READ_ONLY.has(ran))) {
  process.stderr.write(
    `error: ${readerGone ? 'stdout was closed before the result was written' : `stdout could not be written (${stdoutFailure.code ?? stdoutFailure.message})`}; ` +
      (READ_ONLY.has(ran) ? 'nothing was changed' : `${ran} was done`) +
      (ran === 'create' ? ', but the new key is lost with it: revoke it (`npm run keys -- list` shows it by its name) and create another' : '') +
      '\n',
  )
  process.exitCode = 1
} else {
  process.exitCode = code
}
