/**
 * `npm run bench:scale`: the scale phase of `npm run bench` alone (bench/scale/scalePhase.ts), on
 * its own throwaway database, private redis-server and gateway process. Prints the markdown
 * section and writes it to bench/results/scale.md. BENCH_SCALE_KEYS sets the number of keys
 * (default 1,000,000). Exit code 0 when the phase ran clean (a missed target is reported, not
 * fatal), 1 on a failure or an invalid number, 130 when interrupted.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { REPO_ROOT } from '../lib/childServer.ts'
import { createBenchDatabase, findPostgres } from '../lib/database.ts'
import { describeEnvironment } from '../lib/environment.ts'
import type { SharedService } from '../targets/types.ts'
import { renderScaleSection, runScalePhase, scaleKeysFromEnv } from './scalePhase.ts'

const progress = (message: string) => process.stderr.write(`[bench:scale] ${message}\n`)

let interruptedBy: NodeJS.Signals | undefined
const onSignal = (signal: NodeJS.Signals) => {
  if (interruptedBy !== undefined) process.exit(130)
  interruptedBy = signal
  progress(`${signal}: stopping, then cleaning up`)
}
process.on('SIGINT', onSignal)
process.on('SIGTERM', onSignal)
const checkInterrupted = () => {
  if (interruptedBy !== undefined) throw new Error(`interrupted by ${interruptedBy}`)
}

async function main(): Promise<number> {
  const keys = scaleKeysFromEnv()
  if (keys === 0) {
    progress('BENCH_SCALE_KEYS=0: nothing to do')
    return 0
  }
  const environment = describeEnvironment()
  const cleanup: Array<() => Promise<unknown>> = []
  const started = new Map<string, Promise<SharedService>>()
  try {
    const postgres = await findPostgres()
    cleanup.push(() => postgres.stop())
    if (postgres.warning) progress(`WARNING: ${postgres.warning}`)
    const database = await createBenchDatabase(postgres.url, 21)
    cleanup.push(() => database.drop())
    progress(`created database ${database.name} (${postgres.source})`)
    const logDir = await mkdtemp(path.join(os.tmpdir(), 'aas-bench-scale-'))
    cleanup.push(() => (process.env.BENCH_KEEP_LOGS === '1' ? Promise.resolve(progress(`logs kept in ${logDir}`)) : rm(logDir, { recursive: true, force: true })))
    cleanup.push(async () => {
      for (const service of [...started.values()].reverse()) await (await service.catch(() => undefined))?.stop()
    })
    const report = await runScalePhase({
      databaseUrl: database.url,
      logDir,
      nodeArgs: (process.env.BENCH_NODE_ARGS ?? '').split(/\s+/).filter(Boolean),
      shared<T extends SharedService>(id: string, start: () => Promise<T>): Promise<T> {
        if (!started.has(id)) started.set(id, start())
        return started.get(id) as Promise<T>
      },
      keys,
      progress,
      checkInterrupted,
    })
    const header =
      `# Scale of keys (\`npm run bench:scale\`)\n\n` +
      `- Date: ${report.startedAt}\n` +
      `- Command: \`${process.env.BENCH_SCALE_KEYS ? `BENCH_SCALE_KEYS=${process.env.BENCH_SCALE_KEYS} ` : ''}npm run bench:scale\`\n` +
      `- Node ${environment.node}, ${environment.platform}; CPU: ${environment.cpuModel}, ${environment.cores} cores, ${environment.memoryGiB} GiB RAM\n` +
      `- Commit: ${environment.gitCommit}; Postgres ${postgres.version} (${postgres.source})\n\n`
    const markdown = `${header}${renderScaleSection(report)}`
    await mkdir(path.join(REPO_ROOT, 'bench', 'results'), { recursive: true })
    await writeFile(path.join(REPO_ROOT, 'bench', 'results', 'scale.md'), markdown)
    process.stdout.write(markdown)
    progress('wrote bench/results/scale.md')
    return report.problems.length > 0 ? 1 : 0
  } finally {
    for (const step of cleanup.reverse()) {
      try {
        await step()
      } catch (error) {
        progress(`cleanup step failed: ${error instanceof Error ? error.message : String(error)}`)
      }
    }
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    progress(`FAILED: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`)
    process.exit(interruptedBy === undefined ? 1 : 130)
  },
)
