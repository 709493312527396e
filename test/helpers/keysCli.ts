import { runKeys } from '../../gateway/src/cli/run.ts'
import type { CliRun } from '../scripts/processes.ts'

/**
 * The keys CLI's command line run in this process, with `env` as its environment: the same code
 * as `npm run keys -- …` after the process's own work (stdout's reader gone, the exit status),
 * which runKeysCli (test/scripts/processes.ts) covers by running the real entry point. Half a
 * second of CPU less per run than a child process loading it through tsx. What is read from the
 * process's own environment (NODE_OPTIONS, pg's PG* variables) is this process's, not `env`'s: a
 * test that sets such a variable, or must show the CLI reads nothing else, runs the process.
 */
export async function runKeysInProcess(args: string[], env: NodeJS.ProcessEnv): Promise<CliRun> {
  let stdout = ''
  let stderr = ''
  const { code } = await runKeys(args, { out: (text) => void (stdout += text), err: (text) => void (stderr += text) }, env)
  return { args, code, stdout, stderr }
}
