/**
 * `npm run bench`: starts every target itself against a throwaway Postgres database, loads
 * them with autocannon in interleaved rounds (A, B, A, B, …), prints a markdown table on stdout
 * and writes bench/results/latest.md and latest.json. Progress goes to stderr.
 *
 * Exit code: 0 when every round was clean (a missed throughput goal is reported, not fatal);
 * 1 when a server fails to start, answers unexpectedly, dies, or any non-2xx / error appears;
 * 130 when interrupted. The database is dropped in every case.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { REPO_ROOT, ServerStartError } from './lib/childServer.ts'
import { CONFIG_VARIABLES, loadBenchConfig, type BenchConfig } from './lib/config.ts'
import { createBenchDatabase, findPostgres } from './lib/database.ts'
import { describeEnvironment } from './lib/environment.ts'
import { measurement, startLoad, type LoadRun, type RoundMeasurement } from './lib/load.ts'
import { renderGoals, renderMarkdown, renderTable, type BenchReport, type TargetReport } from './lib/report.ts'
import { processCpuSeconds, totalCpuSeconds } from './lib/processCpu.ts'
import { summarize } from './lib/stats.ts'
import { GOALS, OPTIONAL_TARGETS, TARGETS } from './suite.ts'
import type { BenchTarget, RunningTarget } from './targets/types.ts'

const RESULTS_DIR = path.join(REPO_ROOT, 'bench', 'results')

const progress = (message: string) => process.stderr.write(`[bench] ${message}\n`)
const rate = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })

class Interrupted extends Error {
  override name = 'Interrupted'
}

// --- interruption: the first Ctrl-C stops the current load and unwinds through the cleanup.
let interruptedBy: NodeJS.Signals | undefined
let currentLoad: LoadRun | undefined
let cleaningUp = false
function onSignal(signal: NodeJS.Signals): void {
  if (interruptedBy !== undefined) {
    progress(`second ${signal}: exiting without finishing the cleanup (look for aas_bench_* databases)`)
    process.exit(130)
  }
  interruptedBy = signal
  progress(`${signal}: stopping${cleaningUp ? '' : ', then cleaning up'}`)
  currentLoad?.stop()
}
process.on('SIGINT', onSignal)
process.on('SIGTERM', onSignal)

function checkInterrupted(): void {
  if (interruptedBy !== undefined) throw new Interrupted(`interrupted by ${interruptedBy}`)
}

/** The default targets, or exactly those named in BENCH_TARGETS (in that order). */
function selectTargets(config: BenchConfig): BenchTarget[] {
  if (config.targets.length === 0) return TARGETS
  const known = [...TARGETS, ...OPTIONAL_TARGETS]
  return config.targets.map((id) => {
    const target = known.find((candidate) => candidate.id === id)
    if (!target) throw new Error(`unknown target ${id} in BENCH_TARGETS; known: ${known.map((t) => t.id).join(', ')}`)
    return target
  })
}

function commandLine(): string {
  const variables = CONFIG_VARIABLES.filter((name) => process.env[name] !== undefined && process.env[name] !== '').map(
    (name) => (name === 'DATABASE_URL' ? 'DATABASE_URL=…' : `${name}=${process.env[name]}`),
  )
  const base = process.env.npm_lifecycle_event === 'bench' ? 'npm run bench' : 'tsx bench/run.ts'
  return [...variables, base].join(' ')
}

interface LoadStep {
  target: BenchTarget
  running: RunningTarget
  /** 0 for the warm-up. */
  round: number
  seconds: number
  connections: number
  /** The benchmark database's backends right now (empty when Postgres is not local). */
  postgresPids: () => Promise<number[]>
}

/** CPU seconds per pid; pids that cannot be read are left out. */
function cpuByPid(pids: number[]): Map<number, number> {
  const entries: Array<[number, number]> = []
  for (const pid of pids) {
    const seconds = processCpuSeconds(pid)
    if (seconds !== undefined) entries.push([pid, seconds])
  }
  return new Map(entries)
}

async function load(step: LoadStep): Promise<RoundMeasurement> {
  const { target, running, round, seconds, connections, postgresPids } = step
  checkInterrupted()
  const postgresBefore = cpuByPid(await postgresPids())
  const cpuBefore = totalCpuSeconds(running.pids)
  const clientBefore = process.cpuUsage()
  const run = startLoad({
    url: running.url,
    ...(running.method === undefined ? {} : { method: running.method }),
    headers: running.headers,
    ...(running.body === undefined ? {} : { body: running.body }),
    connections,
    durationSeconds: seconds,
  })
  currentLoad = run
  try {
    const result = await run.result
    checkInterrupted()
    const failure = running.failure()
    if (failure !== undefined) throw new Error(`${target.id} ${failure} during the run`)
    const client = process.cpuUsage(clientBefore)
    const cpuAfter = totalCpuSeconds(running.pids)
    const cpu = cpuBefore === undefined || cpuAfter === undefined ? undefined : cpuAfter - cpuBefore
    // Backends that appeared during the round count from zero; the union covers a pool that grew.
    const postgresAfter = cpuByPid(await postgresPids())
    const postgres =
      postgresAfter.size === 0
        ? undefined
        : [...postgresAfter].reduce((sum, [pid, seconds]) => sum + seconds - (postgresBefore.get(pid) ?? 0), 0)
    return measurement(round, result, (client.user + client.system) / 1e6, cpu, postgres)
  } finally {
    currentLoad = undefined
  }
}

async function checkResponse(target: BenchTarget, running: RunningTarget): Promise<void> {
  const response = await fetch(running.url, {
    method: running.method ?? 'GET',
    headers: running.headers,
    ...(running.body === undefined ? {} : { body: running.body }),
    signal: AbortSignal.timeout(5_000),
  })
  const sample = { status: response.status, headers: response.headers, body: await response.text() }
  const problem = target.checkResponse?.(sample) ?? (response.ok ? undefined : `status ${response.status}`)
  if (problem !== undefined) throw new Error(`${target.id} does not answer as expected: ${problem}`)
}

let idWidth = 16

function describeRound(target: BenchTarget, label: string, m: RoundMeasurement): string {
  const bad = m.non2xx + m.errors > 0 ? `  ⚠ non-2xx ${m.non2xx}, errors ${m.errors}` : ''
  return (
    `${label} ${target.id.padEnd(idWidth)} ${rate.format(m.requestsPerSecond).padStart(7)} req/s  ` +
    `p50 ${m.latencyP50} ms  p99 ${m.latencyP99} ms` +
    (m.serverCpuMicrosPerRequest === undefined
      ? ''
      : `  server CPU ${Math.round(m.serverCpuMicrosPerRequest)} µs/req (${Math.round(m.serverCpuPercent ?? 0)} %)`) +
    (m.postgresCpuPercent === undefined ? '' : `  Postgres ${Math.round(m.postgresCpuPercent)} %`) +
    `  client ${Math.round(m.clientCpuPercent)} %` +
    bad
  )
}

async function main(): Promise<number> {
  const config = loadBenchConfig()
  const targets = selectTargets(config)
  idWidth = Math.max(...targets.map((target) => target.id.length))
  const environment = describeEnvironment()
  const startedAt = new Date()
  const cleanup: Array<{ name: string; run: () => Promise<unknown> }> = []
  let keepLogs = config.keepLogs

  if (environment.loadAverageAtStart > environment.cores / 2) {
    progress(
      `WARNING: load average ${environment.loadAverageAtStart} on ${environment.cores} cores before starting; ` +
        'something else is busy and the numbers will be noisy',
    )
  }
  try {
    progress('looking for Postgres')
    const postgres = await findPostgres()
    cleanup.push({ name: 'stop embedded Postgres', run: () => postgres.stop() })
    if (postgres.warning) progress(`WARNING: ${postgres.warning}`)
    checkInterrupted()

    const database = await createBenchDatabase(postgres.url, config.seedPets)
    cleanup.push({ name: `drop database ${database.name}`, run: () => database.drop() })
    progress(
      `created database ${database.name} (${postgres.source}, Postgres ${postgres.version}), ${config.seedPets} pets`,
    )
    checkInterrupted()

    const logDir = await mkdtemp(path.join(os.tmpdir(), 'aas-bench-'))
    cleanup.push({
      name: 'remove server logs',
      run: async () =>
        keepLogs ? progress(`server logs kept in ${logDir}`) : rm(logDir, { recursive: true, force: true }),
    })

    const running = new Map<string, RunningTarget>()
    for (const target of targets) {
      checkInterrupted()
      progress(`starting ${target.id}`)
      try {
        const started = await target.start({ databaseUrl: database.url, logDir, nodeArgs: config.serverNodeArgs })
        running.set(target.id, started)
        cleanup.push({ name: `stop ${target.id}`, run: () => started.stop() })
      } catch (error) {
        // Ctrl-C reaches the children too; a server that died of it is not a start failure.
        checkInterrupted()
        keepLogs = true
        throw error
      }
    }
    for (const target of targets) await checkResponse(target, running.get(target.id) as RunningTarget)

    const reports: TargetReport[] = targets.map((target) => ({
      id: target.id,
      label: target.label,
      request: target.request,
      description: target.description,
      rounds: [],
      summary: summarize([]),
    }))

    const step = { connections: config.connections, postgresPids: () => database.backendPids() }
    if (config.warmupSeconds > 0) {
      for (const [index, target] of targets.entries()) {
        const server = running.get(target.id) as RunningTarget
        const m = await load({ ...step, target, running: server, round: 0, seconds: config.warmupSeconds })
        ;(reports[index] as TargetReport).warmup = m
        progress(describeRound(target, 'warm-up  ', m))
      }
    }
    for (let round = 1; round <= config.rounds; round += 1) {
      for (const [index, target] of targets.entries()) {
        const server = running.get(target.id) as RunningTarget
        const m = await load({ ...step, target, running: server, round, seconds: config.durationSeconds })
        ;(reports[index] as TargetReport).rounds.push(m)
        progress(describeRound(target, `round ${round}/${config.rounds}`, m))
      }
    }
    for (const report of reports) report.summary = summarize(report.rounds)

    const problems: string[] = []
    for (const report of reports) {
      const s = report.summary
      if (s.non2xx > 0) problems.push(`${report.label}: ${s.non2xx} non-2xx responses`)
      if (s.errors > 0) problems.push(`${report.label}: ${s.errors} request errors (${s.timeouts} timeouts)`)
    }
    const summaries = new Map(reports.map((report) => [report.id, report.summary]))
    const goals = GOALS.filter((goal) => summaries.has(goal.subject) && summaries.has(goal.baseline)).map((goal) => {
      const subject = summaries.get(goal.subject)?.medianRequestsPerSecond ?? Number.NaN
      const baseline = summaries.get(goal.baseline)?.medianRequestsPerSecond ?? Number.NaN
      const ratio = subject / baseline
      const subjectCpu = summaries.get(goal.subject)?.medianServerCpuMicrosPerRequest
      const baselineCpu = summaries.get(goal.baseline)?.medianServerCpuMicrosPerRequest
      const cpuRatio = subjectCpu && baselineCpu ? baselineCpu / subjectCpu : undefined
      return { ...goal, ratio, met: ratio >= goal.minRatio, ...(cpuRatio === undefined ? {} : { cpuRatio }) }
    })

    const report: BenchReport = {
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      command: commandLine(),
      environment,
      config,
      database: {
        source: postgres.source,
        version: postgres.version,
        name: database.name,
        pets: config.seedPets,
        ...(postgres.warning === undefined ? {} : { warning: postgres.warning }),
      },
      targets: reports,
      goals,
      problems,
    }
    await mkdir(RESULTS_DIR, { recursive: true })
    await writeFile(path.join(RESULTS_DIR, 'latest.md'), renderMarkdown(report))
    await writeFile(path.join(RESULTS_DIR, 'latest.json'), `${JSON.stringify(report, null, 2)}\n`)

    process.stdout.write(`${renderTable(report)}\n\n## Targets\n\n${renderGoals(report)}\n`)
    if (postgres.warning) process.stdout.write(`\n> **Warning:** ${postgres.warning}\n`)
    if (problems.length > 0) process.stdout.write(`\n## Problems\n\n${problems.map((p) => `- ${p}`).join('\n')}\n`)
    progress('wrote bench/results/latest.md and bench/results/latest.json')
    return problems.length > 0 ? 1 : 0
  } finally {
    cleaningUp = true
    for (const step of cleanup.reverse()) {
      try {
        await step.run()
      } catch (error) {
        progress(`cleanup step "${step.name}" failed: ${error instanceof Error ? error.message : String(error)}`)
      }
    }
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    if (error instanceof Interrupted) {
      progress(error.message)
      process.exit(130)
    }
    const detail =
      error instanceof ServerStartError
        ? error.message
        : error instanceof Error
          ? (error.stack ?? error.message)
          : String(error)
    progress(`FAILED: ${detail}`)
    process.exit(1)
  },
)
