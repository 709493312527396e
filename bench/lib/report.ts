import type { BenchConfig } from './config.ts'
import type { BenchEnvironment } from './environment.ts'
import { NOISY_SPREAD_PERCENT, type GoalReport } from './goals.ts'
import type { RoundMeasurement } from './load.ts'
import type { TargetSummary } from './stats.ts'

export { NOISY_SPREAD_PERCENT } from './goals.ts'

/** A row's MONITOR sample: commands per request sent by clients and run by Lua scripts. */
export interface RedisSample {
  requests: number
  client: Record<string, number>
  script: Record<string, number>
  scriptCallsPerEval: Record<string, number>
}

export interface TargetReport {
  id: string
  label: string
  request: string
  /** The status every response must have (any 2xx when absent). */
  expectedStatus?: number
  redisSample?: RedisSample
  description: string
  /** Why the row was not measured on this machine (nginx not installed); every table says "skipped". */
  skipped?: string
  warmup?: RoundMeasurement
  /** The rounds at the goal level of connections (BenchConfig.connections) and their summary. */
  rounds: RoundMeasurement[]
  summary: TargetSummary
  /** Every closed-loop level of the sweep, ascending (the goal level's rounds are the same as `rounds`). */
  sweep?: SweepLevelReport[]
}

/** One closed-loop level of one row. */
export interface SweepLevelReport {
  connections: number
  durationSeconds: number
  rounds: RoundMeasurement[]
  summary: TargetSummary
}

/** One offered rate of the open-loop phase, every open-loop target at that rate. */
export interface OpenLoopReport {
  /** Fraction of the baseline's saturation rate. */
  load: number
  baseline: string
  /** The baseline's median closed-loop req/s. */
  saturationRate: number
  offeredRate: number
  tool: BenchConfig['openLoopTool']
  targets: Array<{ id: string; label: string; rounds: RoundMeasurement[]; summary: TargetSummary }>
}

export interface BenchReport {
  startedAt: string
  finishedAt: string
  command: string
  environment: BenchEnvironment
  /** 1-minute load average when the run ended. */
  loadAverageAtEnd?: number
  config: BenchConfig
  database: { source: string; version: string; name: string; pets: number; warning?: string }
  targets: TargetReport[]
  openLoop?: OpenLoopReport[]
  goals: GoalReport[]
  /** Anything that makes the numbers invalid (unexpected statuses, errors); the exit code is 1 when present. */
  problems: string[]
}

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })
const decimal = (value: number, digits = 2) =>
  Number.isFinite(value) ? value.toFixed(digits).replace(/\.?0+$/, '') || '0' : 'n/a'
const fixed = (value: number | undefined, digits = 2) => (value === undefined || !Number.isFinite(value) ? 'n/a' : value.toFixed(digits))
const whole = (value: number | undefined) => (value === undefined || !Number.isFinite(value) ? 'n/a' : integer.format(value))

function row(cells: string[]): string {
  return `| ${cells.join(' | ')} |`
}

function table(header: string[], align: string[], rows: string[][]): string {
  return [row(header), row(align), ...rows.map(row)].join('\n')
}

function requestCell(target: TargetReport): string {
  return `\`${target.request}\`${target.expectedStatus === undefined ? '' : ` → ${target.expectedStatus}`}`
}

function median(values: number[]): number | undefined {
  if (values.length === 0) return undefined
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[middle] : ((sorted[middle - 1] ?? 0) + (sorted[middle] ?? 0)) / 2
}

/** Median over every measured round of the run of the CPU nobody measured used (other work on the machine). */
export function otherCpuPercent(report: BenchReport): number | undefined {
  return median(report.targets.flatMap((target) => target.rounds.flatMap((round) => round.otherCpuPercent ?? [])))
}

/** The rows that were measured (not skipped). */
export function measured(report: BenchReport): TargetReport[] {
  return report.targets.filter((target) => target.skipped === undefined)
}

/** A table row for a skipped target: its leading cells, "skipped: why", dashes for the rest. */
function skippedRow(target: TargetReport, columns: number, leading: string[]): string[] {
  return [...leading, `skipped: ${target.skipped ?? ''}`, ...Array.from({ length: columns - leading.length - 1 }, () => '–')]
}

/**
 * Closed-loop throughput at every level of the sweep: median req/s, the min–max of its rounds and
 * p99 per level; the goal level is the one the targets read.
 */
export function renderSweepTable(report: BenchReport): string {
  const levels = [...new Set(report.targets.flatMap((target) => (target.sweep ?? []).map((level) => level.connections)))].sort((a, b) => a - b)
  if (levels.length === 0) return '(no closed-loop sweep in this run)'
  const goalMark = (connections: number) => (connections === report.config.connections ? ' (targets)' : '')
  const header = ['Target', ...levels.flatMap((connections) => [`${connections} conn req/s${goalMark(connections)}`, 'min–max (spread)', 'p99 ms'])]
  const align = ['---', ...levels.flatMap(() => ['---:', '---:', '---:'])]
  const rows = report.targets.map((target) => {
    if (target.skipped !== undefined) return skippedRow(target, header.length, [target.label])
    return [
      target.label,
      ...levels.flatMap((connections) => {
        const level = target.sweep?.find((candidate) => candidate.connections === connections)
        if (!level || level.rounds.length === 0) return ['n/a', 'n/a', 'n/a']
        const s = level.summary
        return [
          integer.format(s.medianRequestsPerSecond),
          `${integer.format(s.minRequestsPerSecond)}–${integer.format(s.maxRequestsPerSecond)} (${decimal(s.spreadPercent, 1)} %)`,
          decimal(s.medianLatencyP99),
        ]
      }),
    ]
  })
  return table(header, align, rows)
}

export function renderTable(report: BenchReport): string {
  const flag = (count: number) => (count === 0 ? '0' : `**${integer.format(count)} ⚠**`)
  return table(
    [
      'Target',
      'Request',
      'req/s (median)',
      'req/s min–max',
      'spread',
      'p50 ms',
      'p99 ms',
      'server CPU µs/req',
      'CPU % server / Postgres / client / other',
      'unexpected status',
      'errors',
    ],
    ['---', '---', '---:', '---:', '---:', '---:', '---:', '---:', '---:', '---:', '---:'],
    report.targets.map((target) => {
      const s = target.summary
      if (target.skipped !== undefined) return skippedRow(target, 11, [target.label, requestCell(target)])
      return [
        target.label,
        requestCell(target),
        integer.format(s.medianRequestsPerSecond),
        `${integer.format(s.minRequestsPerSecond)}–${integer.format(s.maxRequestsPerSecond)}`,
        `${decimal(s.spreadPercent, 1)} %`,
        decimal(s.medianLatencyP50),
        decimal(s.medianLatencyP99),
        s.medianServerCpuMicrosPerRequest === undefined
          ? 'n/a'
          : `${integer.format(s.medianServerCpuMicrosPerRequest)} (${whole(s.minServerCpuMicrosPerRequest)}–${whole(s.maxServerCpuMicrosPerRequest)})`,
        [s.medianServerCpuPercent, s.medianPostgresCpuPercent, s.medianClientCpuPercent, s.medianOtherCpuPercent]
          .map((value) => (value === undefined ? 'n/a' : integer.format(value)))
          .join(' / '),
        flag(s.unexpected),
        flag(s.errors),
      ]
    }),
  )
}

/** CPU per request of every process a row's request passes through, and its Redis commands. */
export function renderCostTable(report: BenchReport): string {
  return table(
    [
      'Target',
      'server µs/req',
      'upstream µs/req',
      'Redis µs/req',
      'Postgres µs/req',
      'Redis commands sent/req',
      'of which EVALSHA + EVAL',
      'executed by Redis/req',
    ],
    ['---', '---:', '---:', '---:', '---:', '---:', '---:', '---:'],
    measured(report).map((target) => {
      const s = target.summary
      const supporting = s.medianSupportingCpuMicrosPerRequest ?? {}
      return [
        target.label,
        whole(s.medianServerCpuMicrosPerRequest),
        whole(supporting.upstream),
        whole(supporting.Redis),
        whole(s.medianPostgresCpuMicrosPerRequest),
        fixed(s.medianRedisCommandsPerRequest),
        fixed(s.medianRedisEvalsPerRequest),
        fixed(s.medianRedisExecutedPerRequest),
      ]
    }),
  )
}

export function renderOpenLoop(report: BenchReport): string {
  const phases = report.openLoop ?? []
  if (phases.length === 0) return '(no open-loop phase in this run)'
  const rows = phases.flatMap((phase) =>
    phase.targets.map((entry) => {
      const s = entry.summary
      return [
        entry.label,
        `${integer.format(phase.offeredRate)} (${Math.round(phase.load * 100)} %)`,
        integer.format(s.medianRequestsPerSecond),
        decimal(s.medianLatencyP50),
        s.medianLatencyP90 === undefined ? 'n/a' : decimal(s.medianLatencyP90),
        decimal(s.medianLatencyP99),
        s.medianLatencyP999 === undefined ? 'n/a' : decimal(s.medianLatencyP999),
        s.medianServiceLatencyP99 === undefined ? 'n/a' : decimal(s.medianServiceLatencyP99),
        whole(s.medianServerCpuMicrosPerRequest),
        [s.medianServerCpuPercent, s.medianClientCpuPercent, s.medianOtherCpuPercent].map(whole).join(' / '),
      ]
    }),
  )
  return table(
    [
      'Target',
      'offered req/s (of saturation)',
      'achieved req/s',
      'p50 ms',
      'p90 ms',
      'p99 ms',
      'p99.9 ms',
      'service p99 ms',
      'server CPU µs/req',
      'CPU % server / client / other',
    ],
    ['---', '---:', '---:', '---:', '---:', '---:', '---:', '---:', '---:', '---:'],
    rows,
  )
}

function labelOf(report: BenchReport, id: string): string {
  return report.targets.find((target) => target.id === id)?.label ?? id
}

export function renderGoals(report: BenchReport): string {
  if (report.goals.length === 0) return '(no goals apply to the selected targets)'
  const verdict = (met: boolean) => `**${met ? 'met' : 'MISSED'}**`
  return report.goals
    .map((goal) => {
      if (goal.kind === 'throughput') {
        const noisy =
          goal.noisy.length === 0
            ? ''
            : ` — rounds of ${goal.noisy.map((id) => labelOf(report, id)).join(' and ')} spread more than ` +
              `${NOISY_SPREAD_PERCENT} %: trust the CPU figure more`
        return (
          `- ${labelOf(report, goal.subject)} ≥ ${goal.minRatio}× ${labelOf(report, goal.baseline)} ` +
          `(${report.config.connections} connections): ` +
          `${verdict(goal.met)} by req/s (${decimal(goal.ratio, 3)}×)` +
          (goal.cpuRatio === undefined ? '' : `; ${verdict(goal.metByCpu ?? false)} by server CPU per request (${decimal(goal.cpuRatio, 3)}×)`) +
          noisy
        )
      }
      if (goal.kind === 'redis-commands') {
        const commands = Object.entries(goal.commands ?? {})
          .sort((a, b) => b[1] - a[1])
          .map(([name, count]) => `${name.toUpperCase()} ${integer.format(count)}`)
          .join(', ')
        return (
          `- ${labelOf(report, goal.subject)}: ${fixed(goal.perRequest)} Redis commands sent per request: ${verdict(goal.met)} ` +
          `(measured ${fixed(goal.measured, 3)}, of which EVALSHA + EVAL ${fixed(goal.evalsPerRequest, 3)}; ` +
          `Redis executed ${fixed(goal.executedPerRequest, 3)} per request counting the script's own calls; ` +
          `commandstats over all rounds: ${commands || 'none'}` +
          (goal.counters === undefined
            ? ')'
            : `; the gateway's own counters over the rounds: ${
                Object.entries(goal.counters)
                  .map(([name, count]) => `${name} ${integer.format(count)}`)
                  .join(', ') || 'none'
              })`)
        )
      }
      if (goal.added === undefined) {
        return `- ${labelOf(report, goal.subject)} p99 at ${Math.round(goal.load * 100)} % of ${labelOf(report, goal.baseline)}'s saturation rate ≤ +${goal.maxAddedMillis} ms: **MISSED** (no open-loop measurement at that load)`
      }
      return (
        `- ${labelOf(report, goal.subject)} p99 ≤ ${labelOf(report, goal.baseline)} p99 + ${goal.maxAddedMillis} ms at ` +
        `${Math.round(goal.load * 100)} % of its saturation rate (${whole(goal.offeredRate)} req/s offered to both): ` +
        `${verdict(goal.met)} (p99 ${decimal(goal.subjectP99 ?? Number.NaN)} vs ${decimal(goal.baselineP99 ?? Number.NaN)} ms, ` +
        `${goal.added >= 0 ? '+' : ''}${decimal(goal.added, 2)} ms; p50 ${decimal(goal.subjectP50 ?? Number.NaN)} vs ${decimal(goal.baselineP50 ?? Number.NaN)} ms)`
      )
    })
    .join('\n')
}

/** What `npm run bench` prints on stdout. */
export function renderSummary(report: BenchReport): string {
  return [
    renderTable(report),
    '',
    '## Throughput by connections (closed loop)',
    '',
    renderSweepTable(report),
    '',
    '## Cost per request',
    '',
    renderCostTable(report),
    '',
    '## Latency at a fixed offered rate (open loop)',
    '',
    renderOpenLoop(report),
    '',
    '## Targets',
    '',
    renderGoals(report),
  ].join('\n')
}

export function renderMarkdown(report: BenchReport): string {
  const { environment: env, config, database } = report
  const other = otherCpuPercent(report)
  const parts = [
    '# Benchmark results',
    '',
    `- Date: ${report.startedAt}`,
    `- Command: \`${report.command}\``,
    `- Node ${env.node}, autocannon ${env.autocannon}, ${env.platform}`,
    `- CPU: ${env.cpuModel}, ${env.cores} cores, ${env.memoryGiB} GiB RAM`,
    `- Machine load: load average ${env.loadAverageAtStart} at start` +
      (report.loadAverageAtEnd === undefined ? '' : `, ${report.loadAverageAtEnd} at the end`) +
      (other === undefined
        ? ''
        : `; during the rounds, CPU used by nothing this benchmark measures (other work on the machine, the ` +
          `kernel's loopback softirq) was ${integer.format(other)} % of one core (median over all rounds)`),
    `- Commit: ${env.gitCommit}`,
    `- Parameters: closed loop at ${config.connectionLevels.join(', ')} connections (pipelining 1); ` +
      `${config.rounds} rounds × ${config.durationSeconds} s per target at ${config.connections} connections, ` +
      `${config.sweepRounds} rounds × ${config.sweepDurationSeconds} s at the other levels, interleaved; ` +
      `${config.warmupSeconds} s warm-up per target (discarded)` +
      ((report.openLoop ?? []).length === 0
        ? ''
        : `; open loop (${config.openLoopTool}) at ${config.openLoopLoads.map((load) => `${Math.round(load * 100)} %`).join(', ')} ` +
          `of ${labelOf(report, config.openLoopBaseline)}'s saturation rate, ${config.openLoopRounds} rounds × ${config.durationSeconds} s`),
    `- Database: Postgres ${database.version} (${database.source}), throwaway database \`${database.name}\` ` +
      `with ${database.pets} pets, dropped afterwards`,
    '- The load generator, the servers, Redis and Postgres share this machine; ' +
      'compare rows of one run, not runs on different machines.',
  ]
  if (database.warning) parts.push('', `> **Warning:** ${database.warning}`)
  parts.push(
    '',
    `![Throughput per row and open-loop latency](latest.svg)`,
    '',
    `## Throughput at ${config.connections} connections (the targets' figures)`,
    '',
    renderTable(report),
    '',
    'req/s: median of the rounds (each round: responses ÷ its duration). p50/p99: median across rounds of ' +
      "each round's latency percentile (autocannon, every response). server CPU µs/req: user + system CPU of " +
      "the target's own server process during a round ÷ its responses, median (min–max) across rounds (from /proc; " +
      'the upstream, Redis, the load generator and Postgres are not included, see the next table). CPU %: median ' +
      "share of one core used during a round by the server process, by the benchmark database's Postgres backends " +
      '(local Postgres only), by the load generator (this process), and by nothing measured here (other work on the ' +
      "machine, kernel softirq); a server near 100 % is the bottleneck, and the columns together near " +
      `${report.environment.cores * 100} % mean the machine was saturated. Spread: (max − min) ÷ median. ` +
      'Unexpected status: responses other than the row’s expected status (any 2xx unless it names one).',
    '',
    '## Throughput by connections (closed loop)',
    '',
    renderSweepTable(report),
    '',
    `Each level is its own interleaved set of rounds (targets A, B, A, B, …). The ${config.connections}-connection ` +
      `level (the targets' figures, the table above) runs ${config.rounds} rounds × ${config.durationSeconds} s; the others ` +
      `${config.sweepRounds} rounds × ${config.sweepDurationSeconds} s, so their min–max spread is printed beside each median. ` +
      'At 1 connection req/s is 1 ÷ the round-trip time; at 100 the server (or the load generator: see its CPU %) is saturated.',
    '',
    '## Cost per request',
    '',
    renderCostTable(report),
    '',
    'Median across rounds of CPU µs per response of each process the request passes through (/proc). Redis ' +
      'commands come from `INFO commandstats` deltas on the private redis-server around each round (INFO, the ' +
      'harness’s own, left out). commandstats also counts every command a Lua script runs (redis.call), so ' +
      '"executed" is everything Redis ran and "sent" subtracts what the row’s scripts run per EVALSHA, learned ' +
      'from a MONITOR sample of 100 requests taken before the warm-up: "sent" is the round trips the server made. ' +
      'Commands per request divide by the gateway’s own count of rate-limit decisions where it has one (the ' +
      'delta also holds the commands of requests still in flight when a round stops), else by the responses. ' +
      'n/a: the row does not use Redis.',
    '',
    '## Latency at a fixed offered rate (open loop)',
    '',
    renderOpenLoop(report),
    '',
    config.openLoopTool === 'paced'
      ? 'bench/lib/openLoop.ts: requests leave on a fixed schedule (evenly spaced) over a pool of ' +
        `${config.connections} keep-alive connections, whatever the answers do; latency runs from each request's ` +
        'scheduled send time (coordinated omission corrected); service p99 runs from the actual send. Every open-loop ' +
        'target is offered the same rate; medians across rounds.'
      : "autocannon's overallRate: each connection sends its per-second quota back to back, then waits for the next " +
        'second. That is a closed loop at full concurrency for part of every second, so these percentiles are close to ' +
        'the saturated ones (an experiment, not the target measurement).',
    '',
    '## Targets',
    '',
    renderGoals(report),
  )
  const noisy = measured(report).filter((target) => target.summary.spreadPercent > NOISY_SPREAD_PERCENT)
  if (noisy.length > 0) {
    parts.push(
      '',
      `> Spread above ${NOISY_SPREAD_PERCENT} % for ${noisy.map((target) => target.label).join(', ')}: ` +
        'the machine was busy (see Machine load above) or the rounds too short; prefer the server CPU column, ' +
        'or rerun on a quiet machine with more rounds.',
    )
  }
  if (report.problems.length > 0) {
    parts.push('', '## Problems (these numbers are not valid)', '', ...report.problems.map((problem) => `- ${problem}`))
  }
  const sampled = report.targets.filter((target) => target.redisSample)
  if (sampled.length > 0) {
    const perRequest = (counts: Record<string, number>, requests: number) =>
      Object.entries(counts)
        .sort((a, b) => b[1] - a[1])
        .map(([name, calls]) => `${name.toUpperCase()} ${fixed(calls / requests)}`)
        .join(', ') || 'none'
    parts.push('', '## Redis commands per request (MONITOR sample, before the warm-up)', '')
    for (const target of sampled) {
      const sample = target.redisSample as RedisSample
      parts.push(
        `- ${target.label} (${sample.requests} requests, one at a time): sent by the server ${perRequest(sample.client, sample.requests)}; ` +
          `run inside Lua scripts ${perRequest(sample.script, sample.requests)}`,
      )
    }
  }
  const counted = report.targets.filter((target) => target.summary.counters !== undefined)
  if (counted.length > 0) {
    parts.push('', "## The servers' own counters over the measured rounds", '')
    for (const target of counted) {
      const counters = Object.entries(target.summary.counters ?? {})
        .map(([name, count]) => `${name} ${integer.format(count)}`)
        .join(', ')
      parts.push(`- ${target.label}: ${counters || 'no change'}`)
    }
  }
  parts.push('', '## Rounds', '')
  for (const target of report.targets) {
    if (target.skipped !== undefined) {
      parts.push(`- ${target.label}: skipped (${target.skipped})`)
      continue
    }
    const warmup = target.warmup ? ` (warm-up ${integer.format(target.warmup.requestsPerSecond)})` : ''
    const cpuPerRound = target.rounds.map((round) => round.serverCpuMicrosPerRequest)
    const cpu = cpuPerRound.every((value) => value !== undefined)
      ? `; server CPU µs/req ${cpuPerRound.map((value) => integer.format(value ?? 0)).join(', ')}`
      : ''
    parts.push(
      `- ${target.label}: req/s ${target.rounds.map((round) => integer.format(round.requestsPerSecond)).join(', ')}` +
        `${warmup}${cpu}` +
        (target.sweep ?? [])
          .filter((level) => level.connections !== config.connections)
          .map((level) => `; ${level.connections} conn req/s ${level.rounds.map((round) => integer.format(round.requestsPerSecond)).join(', ')}`)
          .join(''),
    )
  }
  for (const phase of report.openLoop ?? []) {
    for (const entry of phase.targets) {
      parts.push(
        `- ${entry.label}, open loop ${integer.format(phase.offeredRate)} req/s: p99 ms ` +
          `${entry.rounds.map((round) => decimal(round.latencyP99)).join(', ')}; p50 ms ${entry.rounds.map((round) => decimal(round.latencyP50)).join(', ')}`,
      )
    }
  }
  parts.push('', '## What each row runs', '')
  for (const target of report.targets) parts.push(`- **${target.label}** (\`${target.id}\`): ${target.description}`)
  return `${parts.join('\n')}\n`
}
