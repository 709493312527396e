/**
 * `npm run bench`: starts every target itself (and the services they share: the static upstream,
 * a private redis-server, the gateway) against a throwaway Postgres database, loads them with
 * autocannon in interleaved closed-loop rounds (A, B, A, B, …), then offers the open-loop rows a
 * fixed rate (bench/lib/openLoop.ts), prints markdown tables on stdout and writes
 * bench/results/latest.md and latest.json. Progress goes to stderr. See bench/README.md.
 *
 * Exit code: 0 when every round was clean (a missed target is reported, not fatal); 1 when a
 * server fails to start, answers unexpectedly, dies, or any unexpected status / request error
 * appears; 130 when interrupted. The database is dropped and every process stopped in every case.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { REPO_ROOT, ServerStartError } from './lib/childServer.ts'
import { CONFIG_VARIABLES, loadBenchConfig, type BenchConfig } from './lib/config.ts'
import { createBenchDatabase, findPostgres } from './lib/database.ts'
import { RedisUnavailableError } from './lib/redisServer.ts'
import { describeEnvironment } from './lib/environment.ts'
import type { Result } from 'autocannon'
import { evaluateGoals } from './lib/goals.ts'
import {
  autocannonRateMeasurement,
  measurement,
  openLoopMeasurement,
  startLoad,
  type LoadRun,
  type RoundMeasurement,
  type RoundUsage,
} from './lib/load.ts'
import { startOpenLoop, type OpenLoopResult } from './lib/openLoop.ts'
import { renderMarkdown, renderSummary, type BenchReport, type OpenLoopReport, type RedisSample, type TargetReport } from './lib/report.ts'
import { renderChart } from './lib/chart.ts'
import { machineBusyCpuSeconds, processCpuSeconds, totalCpuSeconds } from './lib/processCpu.ts'
import { createProgress, estimateRemaining } from './lib/progress.ts'
import { summarize } from './lib/stats.ts'
import { STEP_OVERHEAD_SECONDS, planSteps, planSweep, plannedSeconds, type PlannedStep } from './lib/sweep.ts'
import { GOALS, OPTIONAL_TARGETS, TARGETS } from './suite.ts'
import { renderScaleSection, runScaleFromEnv } from './scale/scalePhase.ts'
import type { BenchTarget, RunningTarget, SharedService, TargetContext } from './targets/types.ts'

const RESULTS_DIR = path.join(REPO_ROOT, 'bench', 'results')

// A redrawn progress line on a terminal; the plain `[bench] …` lines otherwise (bench/lib/progress.ts).
const bar = createProgress()
const progress = (message: string) => bar.log(message)
const rate = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })

class Interrupted extends Error {
  override name = 'Interrupted'
}

// --- interruption: the first Ctrl-C stops the current load and unwinds through the cleanup.
let interruptedBy: NodeJS.Signals | undefined
let currentLoad: { stop(): void } | undefined
let cleaningUp = false
let interruptedAt = 0
// One Ctrl-C can arrive twice: the terminal signals the whole process group, and tsx's parent
// process relays the same signal to this one. A repeat within a second is that echo, not a
// second Ctrl-C, and must not skip the cleanup.
const SIGNAL_ECHO_MILLIS = 1_000
function onSignal(signal: NodeJS.Signals): void {
  if (interruptedBy !== undefined && Date.now() - interruptedAt < SIGNAL_ECHO_MILLIS) return
  if (interruptedBy !== undefined) {
    progress(`second ${signal}: exiting without finishing the cleanup (look for aas_bench_* databases)`)
    process.exit(130)
  }
  interruptedBy = signal
  interruptedAt = Date.now()
  progress(`${signal}: stopping${cleaningUp ? '' : ', then cleaning up'}`)
  currentLoad?.stop()
}
process.on('SIGINT', onSignal)
process.on('SIGTERM', onSignal)

function checkInterrupted(): void {
  if (interruptedBy !== undefined) throw new Interrupted(`interrupted by ${interruptedBy}`)
}

/**
 * The progress bar's view of the plan: which step runs, how much is done, how long the rest takes
 * at the pace so far.
 */
function planProgress(plan: PlannedStep[]) {
  const total = plannedSeconds(plan)
  let done = 0
  let firstStepAt: number | undefined
  return {
    begin(phase: string, target: string, round: number, rounds: number, seconds: number): () => void {
      firstStepAt ??= Date.now()
      const elapsed = (Date.now() - firstStepAt) / 1000
      bar.update({ phase, target, round, rounds, fraction: total > 0 ? done / total : 0, etaSeconds: estimateRemaining(done, Math.max(0, total - done), elapsed) })
      return () => {
        done += seconds + STEP_OVERHEAD_SECONDS
      }
    },
  }
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
  /** Open loop: the offered rate and the generator; closed loop (autocannon) when unset. */
  openLoop?: { rate: number; tool: BenchConfig['openLoopTool'] }
  /** What this row's Lua scripts run per EVALSHA/EVAL (from its MONITOR sample). */
  scriptCallsPerEval?: Record<string, number>
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

/** Redis command calls that happened between two INFO commandstats reads (INFO itself left out). */
function commandDelta(before: Map<string, number>, after: Map<string, number>): Record<string, number> {
  const delta: Record<string, number> = {}
  for (const [name, calls] of after) {
    if (name === 'info') continue
    const difference = calls - (before.get(name) ?? 0)
    if (difference > 0) delta[name] = difference
  }
  return delta
}

function counterDelta(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  const delta: Record<string, number> = {}
  for (const [name, value] of Object.entries(after)) {
    const difference = value - (before[name] ?? 0)
    if (difference !== 0) delta[name] = difference
  }
  return delta
}

function supportingCpu(running: RunningTarget): Map<string, number> | undefined {
  const totals = new Map<string, number>()
  for (const process of running.supporting ?? []) {
    const seconds = processCpuSeconds(process.pid)
    if (seconds === undefined) return undefined
    totals.set(process.role, (totals.get(process.role) ?? 0) + seconds)
  }
  return totals
}

async function load(step: LoadStep): Promise<RoundMeasurement> {
  const { target, running, round, seconds, connections, postgresPids, openLoop, scriptCallsPerEval } = step
  checkInterrupted()
  const commandsBefore = await running.redis?.commandCalls()
  const countersBefore = await running.counters?.()
  const postgresBefore = cpuByPid(await postgresPids())
  const supportingBefore = supportingCpu(running)
  const cpuBefore = totalCpuSeconds(running.pids)
  const machineBefore = machineBusyCpuSeconds()
  const clientBefore = process.cpuUsage()
  const request = {
    url: running.url,
    ...(running.method === undefined ? {} : { method: running.method }),
    headers: running.headers,
    ...(running.body === undefined ? {} : { body: running.body }),
    connections,
    durationSeconds: seconds,
  }
  const paced = openLoop?.tool === 'paced' ? startOpenLoop({ ...request, ratePerSecond: openLoop.rate }) : undefined
  const closed = paced ? undefined : startLoad({ ...request, ...(openLoop ? { overallRate: Math.round(openLoop.rate) } : {}) })
  const run = (paced ?? closed) as { stop(): void }
  currentLoad = run
  try {
    const result = paced ? await paced.result : await (closed as LoadRun).result
    checkInterrupted()
    const failure = running.failure()
    if (failure !== undefined) throw new Error(`${target.id} ${failure} during the run`)
    const client = process.cpuUsage(clientBefore)
    const machineAfter = machineBusyCpuSeconds()
    const cpuAfter = totalCpuSeconds(running.pids)
    const supportingAfter = supportingCpu(running)
    // Backends that appeared during the round count from zero; the union covers a pool that grew.
    const postgresAfter = cpuByPid(await postgresPids())
    const commandsAfter = commandsBefore === undefined ? undefined : await running.redis?.commandCalls()
    const countersAfter = countersBefore === undefined ? undefined : await running.counters?.()
    const usage: RoundUsage = {
      clientCpuSeconds: (client.user + client.system) / 1e6,
      ...(cpuBefore === undefined || cpuAfter === undefined ? {} : { serverCpuSeconds: cpuAfter - cpuBefore }),
      ...(postgresAfter.size === 0
        ? {}
        : {
            postgresCpuSeconds: [...postgresAfter].reduce(
              (sum, [pid, seconds]) => sum + seconds - (postgresBefore.get(pid) ?? 0),
              0,
            ),
          }),
      supportingCpuSeconds:
        supportingBefore === undefined || supportingAfter === undefined
          ? {}
          : Object.fromEntries([...supportingAfter].map(([role, seconds]) => [role, seconds - (supportingBefore.get(role) ?? 0)])),
      ...(commandsBefore === undefined || commandsAfter === undefined ? {} : { redisCommands: commandDelta(commandsBefore, commandsAfter) }),
      ...(machineBefore === undefined || machineAfter === undefined ? {} : { machineCpuSeconds: machineAfter - machineBefore }),
      ...(scriptCallsPerEval === undefined ? {} : { scriptCallsPerEval }),
      ...(countersBefore === undefined || countersAfter === undefined ? {} : { counters: counterDelta(countersBefore, countersAfter) }),
    }
    if (paced) return openLoopMeasurement(round, result as OpenLoopResult, usage, target.expectedStatus)
    if (openLoop) return autocannonRateMeasurement(round, result as Result, usage, openLoop.rate, target.expectedStatus)
    return measurement(round, result as Result, usage, target.expectedStatus)
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
  const expected = target.expectedStatus
  const problem =
    target.checkResponse?.(sample) ??
    (expected === undefined ? (response.ok ? undefined : `status ${response.status}`) : response.status === expected ? undefined : `status ${response.status}, expected ${expected}`)
  if (problem !== undefined) throw new Error(`${target.id} does not answer as expected: ${problem}`)
}

/** Requests a target's MONITOR sample sends, one after the other. */
const MONITOR_SAMPLE_REQUESTS = 100

/**
 * Sends MONITOR_SAMPLE_REQUESTS requests one at a time with MONITOR open on the private Redis:
 * which commands the clients send per request, and which their Lua scripts run. Outside the
 * measured rounds (MONITOR slows Redis down).
 */
async function sampleRedisCommands(target: BenchTarget, running: RunningTarget): Promise<RedisSample | undefined> {
  if (!running.redis) return undefined
  const sample = await running.redis.monitor(async () => {
    for (let index = 0; index < MONITOR_SAMPLE_REQUESTS; index += 1) {
      const response = await fetch(running.url, {
        method: running.method ?? 'GET',
        headers: running.headers,
        ...(running.body === undefined ? {} : { body: running.body }),
        signal: AbortSignal.timeout(5_000),
      })
      await response.arrayBuffer()
      const fine = target.expectedStatus === undefined ? response.ok : response.status === target.expectedStatus
      if (!fine) throw new Error(`${target.id} answered ${response.status} during its Redis command sample`)
    }
  })
  const evals = (sample.client.evalsha ?? 0) + (sample.client.eval ?? 0)
  const scriptCallsPerEval =
    evals === 0 ? {} : Object.fromEntries(Object.entries(sample.script).map(([name, calls]) => [name, calls / evals]))
  return { requests: MONITOR_SAMPLE_REQUESTS, ...sample, scriptCallsPerEval }
}

let idWidth = 16

function describeRound(target: BenchTarget, label: string, m: RoundMeasurement): string {
  const bad = m.unexpected + m.errors > 0 ? `  ⚠ unexpected status ${m.unexpected}, errors ${m.errors}` : ''
  const offered = m.offeredRate === undefined ? '' : ` (offered ${rate.format(m.offeredRate)})`
  return (
    `${label} ${target.id.padEnd(idWidth)} ${rate.format(m.requestsPerSecond).padStart(7)} req/s${offered}  ` +
    `p50 ${m.latencyP50} ms  p99 ${m.latencyP99} ms` +
    (m.serverCpuMicrosPerRequest === undefined
      ? ''
      : `  server CPU ${Math.round(m.serverCpuMicrosPerRequest)} µs/req (${Math.round(m.serverCpuPercent ?? 0)} %)`) +
    (m.postgresCpuPercent === undefined ? '' : `  Postgres ${Math.round(m.postgresCpuPercent)} %`) +
    (m.redisCommandsPerRequest === undefined ? '' : `  Redis ${m.redisCommandsPerRequest.toFixed(2)} cmd/req`) +
    (m.counters?.['decisions from fallback'] ? `  ⚠ ${m.counters['decisions from fallback']} fallback decisions` : '') +
    `  client ${Math.round(m.clientCpuPercent)} %` +
    bad
  )
}

/** Shared services (the static upstream, Redis, the gateway) by id, started on first use. */
function sharedServices() {
  const started = new Map<string, Promise<SharedService>>()
  return {
    shared<T extends SharedService>(id: string, start: () => Promise<T>): Promise<T> {
      let service = started.get(id)
      if (!service) {
        progress(`starting shared ${id}`)
        service = start()
        started.set(id, service)
      }
      return service as Promise<T>
    },
    async stopAll(): Promise<void> {
      // Reverse start order: the gateway before the Redis and upstream it uses.
      for (const service of [...started.values()].reverse()) {
        const running = await service.catch(() => undefined)
        await running?.stop()
      }
    },
  }
}

async function main(): Promise<number> {
  const config = loadBenchConfig()
  const selected = selectTargets(config)
  // Rows this machine cannot run (nginx not installed) are reported as skipped, never started.
  const skipped = new Map(
    selected.flatMap((target) => {
      const reason = target.unavailable?.()
      return reason === undefined ? [] : [[target.id, reason] as const]
    }),
  )
  const targets = selected.filter((target) => !skipped.has(target.id))
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
  for (const [id, reason] of skipped) progress(`skipping ${id}: ${reason}`)
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
    const services = sharedServices()
    cleanup.push({ name: 'stop shared services', run: () => services.stopAll() })
    const context: TargetContext = { databaseUrl: database.url, logDir, nodeArgs: config.serverNodeArgs, shared: services.shared }

    const running = new Map<string, RunningTarget>()
    for (const target of targets) {
      checkInterrupted()
      progress(`starting ${target.id}`)
      try {
        const started = await target.start(context)
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
    const redisSamples = new Map<string, RedisSample>()
    for (const target of targets) {
      const sample = await sampleRedisCommands(target, running.get(target.id) as RunningTarget)
      if (sample) {
        redisSamples.set(target.id, sample)
        const perRequest = (counts: Record<string, number>) =>
          Object.entries(counts).map(([name, calls]) => `${name.toUpperCase()} ${(calls / sample.requests).toFixed(2)}`).join(', ') || 'none'
        progress(`${target.id}: Redis per request, sent by clients: ${perRequest(sample.client)}; run by scripts: ${perRequest(sample.script)}`)
      }
    }

    const reports: TargetReport[] = selected.map((target) => ({
      id: target.id,
      label: target.label,
      request: target.request,
      ...(skipped.has(target.id) ? { skipped: skipped.get(target.id) } : {}),
      ...(target.expectedStatus === undefined ? {} : { expectedStatus: target.expectedStatus }),
      ...(redisSamples.has(target.id) ? { redisSample: redisSamples.get(target.id) } : {}),
      description: target.description,
      rounds: [],
      summary: summarize([]),
      sweep: [],
    }))
    const reportOf = (target: BenchTarget) => reports.find((report) => report.id === target.id) as TargetReport
    const openTargets = targets.filter((target) => target.openLoop)
    const plan = planProgress(planSteps(config, targets.length, openTargets.length))

    const step = { connections: config.connections, postgresPids: () => database.backendPids() }
    const scripts = (target: BenchTarget) => {
      const perEval = redisSamples.get(target.id)?.scriptCallsPerEval
      return perEval === undefined ? {} : { scriptCallsPerEval: perEval }
    }
    if (config.warmupSeconds > 0) {
      for (const target of targets) {
        const server = running.get(target.id) as RunningTarget
        const finish = plan.begin('warm-up', target.id, 0, 0, config.warmupSeconds)
        const m = await load({ ...step, ...scripts(target), target, running: server, round: 0, seconds: config.warmupSeconds })
        finish()
        reportOf(target).warmup = m
        progress(describeRound(target, 'warm-up  ', m))
      }
    }
    // Closed loop at every level of the sweep (1, 10, 100 connections by default), targets
    // interleaved within each round; the goal level's rounds are also the table's main columns.
    for (const point of planSweep(config)) {
      for (const target of targets) {
        reportOf(target).sweep?.push({ connections: point.connections, durationSeconds: point.durationSeconds, rounds: [], summary: summarize([]) })
      }
      for (let round = 1; round <= point.rounds; round += 1) {
        for (const target of targets) {
          const server = running.get(target.id) as RunningTarget
          const finish = plan.begin(`closed ${point.connections} conn`, target.id, round, point.rounds, point.durationSeconds)
          const m = await load({
            ...step,
            ...scripts(target),
            connections: point.connections,
            target,
            running: server,
            round,
            seconds: point.durationSeconds,
          })
          finish()
          const report = reportOf(target)
          if (point.goal) report.rounds.push(m)
          report.sweep?.at(-1)?.rounds.push(m)
          progress(describeRound(target, `${String(point.connections).padStart(3)} conn ${round}/${point.rounds}`, m))
        }
      }
    }
    for (const report of reports) {
      for (const level of report.sweep ?? []) level.summary = summarize(level.rounds)
    }
    for (const report of reports) report.summary = summarize(report.rounds)

    // Open loop: the same offered rate to every open-loop target, a fraction of the baseline's saturation rate.
    const openLoop: OpenLoopReport[] = []
    const saturation = reports.find((report) => report.id === config.openLoopBaseline && !report.skipped)?.summary.medianRequestsPerSecond
    if (config.openLoopLoads.length > 0 && openTargets.length > 0) {
      if (saturation === undefined || !Number.isFinite(saturation)) {
        progress(`open loop skipped: its baseline ${config.openLoopBaseline} is not among the targets`)
      } else {
        for (const fraction of config.openLoopLoads) {
          const offered = Math.max(1, Math.round(saturation * fraction))
          const phase: OpenLoopReport = {
            load: fraction,
            baseline: config.openLoopBaseline,
            saturationRate: saturation,
            offeredRate: offered,
            tool: config.openLoopTool,
            targets: openTargets.map((target) => ({ id: target.id, label: target.label, rounds: [], summary: summarize([]) })),
          }
          for (let round = 1; round <= config.openLoopRounds; round += 1) {
            for (const [index, target] of openTargets.entries()) {
              const server = running.get(target.id) as RunningTarget
              const finish = plan.begin(`open ${Math.round(fraction * 100)} %`, target.id, round, config.openLoopRounds, config.durationSeconds)
              const m = await load({
                ...step,
                ...scripts(target),
                target,
                running: server,
                round,
                seconds: config.durationSeconds,
                openLoop: { rate: offered, tool: config.openLoopTool },
              })
              finish()
              phase.targets[index]?.rounds.push(m)
              progress(describeRound(target, `open ${Math.round(fraction * 100)} % ${round}/${config.openLoopRounds}`, m))
            }
          }
          for (const entry of phase.targets) entry.summary = summarize(entry.rounds)
          openLoop.push(phase)
        }
      }
    }

    const problems: string[] = []
    const allRows = [...reports, ...openLoop.flatMap((phase) => phase.targets.map((entry) => ({ ...entry, label: `${entry.label} (open loop ${Math.round(phase.load * 100)} %)` })))]
    for (const report of allRows) {
      const s = report.summary
      if (s.unexpected > 0) problems.push(`${report.label}: ${s.unexpected} responses with an unexpected status`)
      if (s.errors > 0) problems.push(`${report.label}: ${s.errors} request errors (${s.timeouts} timeouts)`)
    }
    const goals = evaluateGoals(
      GOALS,
      reports.filter((report) => report.skipped === undefined),
      openLoop,
    )

    const report: BenchReport = {
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      command: commandLine(),
      environment,
      loadAverageAtEnd: Math.round((os.loadavg()[0] ?? 0) * 100) / 100,
      config,
      database: {
        source: postgres.source,
        version: postgres.version,
        name: database.name,
        pets: config.seedPets,
        ...(postgres.warning === undefined ? {} : { warning: postgres.warning }),
      },
      targets: reports,
      openLoop,
      goals,
      problems,
    }
    // Scale of keys (bench/scale/): BENCH_SCALE_KEYS distinct keys (default 1,000,000); 0 skips it.
    bar.update({ phase: 'scale of keys', target: 'bench/scale', round: 0, rounds: 0, fraction: 1 })
    const scale = await runScaleFromEnv({ ...context, progress, checkInterrupted })
    if (scale) problems.push(...scale.problems)
    const scaleSection = scale ? `\n${renderScaleSection(scale)}` : ''
    await mkdir(RESULTS_DIR, { recursive: true })
    await writeFile(path.join(RESULTS_DIR, 'latest.md'), renderMarkdown(report) + scaleSection)
    await writeFile(path.join(RESULTS_DIR, 'latest.json'), `${JSON.stringify(report, null, 2)}\n`)
    await writeFile(path.join(RESULTS_DIR, 'latest.svg'), renderChart(report))

    bar.done()
    process.stdout.write(`${renderSummary(report)}\n${scaleSection}`)
    if (postgres.warning) process.stdout.write(`\n> **Warning:** ${postgres.warning}\n`)
    if (problems.length > 0) process.stdout.write(`\n## Problems\n\n${problems.map((p) => `- ${p}`).join('\n')}\n`)
    progress('wrote bench/results/latest.md, latest.svg and latest.json')
    return problems.length > 0 ? 1 : 0
  } finally {
    bar.done()
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
      error instanceof ServerStartError || error instanceof RedisUnavailableError
        ? error.message
        : error instanceof Error
          ? (error.stack ?? error.message)
          : String(error)
    progress(`FAILED: ${detail}`)
    process.exit(1)
  },
)
