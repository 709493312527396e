import type { BenchConfig } from './config.ts'
import type { BenchEnvironment } from './environment.ts'
import type { RoundMeasurement } from './load.ts'
import type { TargetSummary } from './stats.ts'

export interface TargetReport {
  id: string
  label: string
  request: string
  description: string
  warmup?: RoundMeasurement
  rounds: RoundMeasurement[]
  summary: TargetSummary
}

export interface GoalReport {
  subject: string
  baseline: string
  minRatio: number
  ratio: number
  met: boolean
  /** baseline ÷ subject server CPU per request: the same comparison, less sensitive to a busy machine. */
  cpuRatio?: number
}

export interface BenchReport {
  startedAt: string
  finishedAt: string
  command: string
  environment: BenchEnvironment
  config: BenchConfig
  database: { source: string; version: string; name: string; pets: number; warning?: string }
  targets: TargetReport[]
  goals: GoalReport[]
  /** Anything that makes the numbers invalid (non-2xx, errors); the exit code is 1 when present. */
  problems: string[]
}

/** Rounds of one target further apart than this (max − min, % of the median) are called noisy. */
export const NOISY_SPREAD_PERCENT = 15

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })
const decimal = (value: number, digits = 2) =>
  Number.isFinite(value) ? value.toFixed(digits).replace(/\.?0+$/, '') || '0' : 'n/a'

function row(cells: string[]): string {
  return `| ${cells.join(' | ')} |`
}

export function renderTable(report: BenchReport): string {
  const lines = [
    row([
      'Target',
      'Request',
      'req/s (median)',
      'req/s min–max',
      'spread',
      'p50 ms',
      'p99 ms',
      'server CPU µs/req',
      'CPU % server / Postgres / client',
      'non-2xx',
      'errors',
    ]),
    row(['---', '---', '---:', '---:', '---:', '---:', '---:', '---:', '---:', '---:', '---:']),
  ]
  for (const target of report.targets) {
    const s = target.summary
    const flag = (count: number) => (count === 0 ? '0' : `**${integer.format(count)} ⚠**`)
    lines.push(
      row([
        target.label,
        `\`${target.request}\``,
        integer.format(s.medianRequestsPerSecond),
        `${integer.format(s.minRequestsPerSecond)}–${integer.format(s.maxRequestsPerSecond)}`,
        `${decimal(s.spreadPercent, 1)} %`,
        decimal(s.medianLatencyP50),
        decimal(s.medianLatencyP99),
        s.medianServerCpuMicrosPerRequest === undefined ? 'n/a' : integer.format(s.medianServerCpuMicrosPerRequest),
        [s.medianServerCpuPercent, s.medianPostgresCpuPercent, s.medianClientCpuPercent]
          .map((value) => (value === undefined ? 'n/a' : integer.format(value)))
          .join(' / '),
        flag(s.non2xx),
        flag(s.errors),
      ]),
    )
  }
  return lines.join('\n')
}

export function renderGoals(report: BenchReport): string {
  if (report.goals.length === 0) return '(no goals apply to the selected targets)'
  const target = (id: string) => report.targets.find((candidate) => candidate.id === id)
  return report.goals
    .map((goal) => {
      const noisy = [target(goal.subject), target(goal.baseline)].filter(
        (row) => row !== undefined && row.summary.spreadPercent > NOISY_SPREAD_PERCENT,
      )
      return (
        `- ${target(goal.subject)?.label ?? goal.subject} throughput ≥ ${goal.minRatio}× ` +
        `${target(goal.baseline)?.label ?? goal.baseline}: ` +
        `**${goal.met ? 'met' : 'MISSED'}** (measured ${decimal(goal.ratio, 3)}×` +
        (goal.cpuRatio === undefined ? ')' : `; by server CPU per request ${decimal(goal.cpuRatio, 3)}×)`) +
        (noisy.length === 0
          ? ''
          : ` — unreliable: rounds of ${noisy.map((row) => row?.label).join(' and ')} spread more than ` +
            `${NOISY_SPREAD_PERCENT} %; rerun on a quiet machine`)
      )
    })
    .join('\n')
}

export function renderMarkdown(report: BenchReport): string {
  const { environment: env, config, database } = report
  const parts = [
    '# Benchmark results',
    '',
    `- Date: ${report.startedAt}`,
    `- Command: \`${report.command}\``,
    `- Node ${env.node}, autocannon ${env.autocannon}, ${env.platform}`,
    `- CPU: ${env.cpuModel}, ${env.cores} cores, ${env.memoryGiB} GiB RAM; ` +
      `load average at start ${env.loadAverageAtStart}`,
    `- Commit: ${env.gitCommit}`,
    `- Parameters: ${config.rounds} rounds × ${config.durationSeconds} s per target, interleaved; ` +
      `${config.warmupSeconds} s warm-up per target (discarded); ${config.connections} connections, pipelining 1`,
    `- Database: Postgres ${database.version} (${database.source}), throwaway database \`${database.name}\` ` +
      `with ${database.pets} pets, dropped afterwards`,
    '- The load generator, the servers and Postgres share this machine; ' +
      'compare rows of one run, not runs on different machines.',
  ]
  if (database.warning) parts.push('', `> **Warning:** ${database.warning}`)
  parts.push(
    '',
    renderTable(report),
    '',
    'req/s: median of the rounds (each round: responses ÷ its duration). p50/p99: median across rounds of ' +
      "each round's latency percentile (autocannon, 2xx responses). server CPU µs/req: user + system CPU of " +
      "the target's server process during a round ÷ its responses, median across rounds (from /proc; the " +
      'load generator and Postgres are not included). CPU %: median share of one core used during a round by the ' +
      "server process, by the benchmark database's Postgres backends (local Postgres only) and by the load " +
      'generator (this process); a server near 100 % is the bottleneck, and the three together near ' +
      `${report.environment.cores * 100} % mean the machine was saturated. ` +
      'Spread: (max − min) ÷ median.',
    '',
    '## Targets',
    '',
    renderGoals(report),
  )
  const noisy = report.targets.filter((target) => target.summary.spreadPercent > NOISY_SPREAD_PERCENT)
  if (noisy.length > 0) {
    parts.push(
      '',
      `> Spread above ${NOISY_SPREAD_PERCENT} % for ${noisy.map((target) => target.label).join(', ')}: ` +
        'the machine was ' +
        'busy (load average at start ' +
        `${env.loadAverageAtStart} on ${env.cores} cores) or the rounds too short; prefer the server CPU column, ` +
        'or rerun on a quiet machine with more rounds.',
    )
  }
  if (report.problems.length > 0) {
    parts.push('', '## Problems (these numbers are not valid)', '', ...report.problems.map((problem) => `- ${problem}`))
  }
  parts.push('', '## Rounds', '')
  for (const target of report.targets) {
    const warmup = target.warmup ? ` (warm-up ${integer.format(target.warmup.requestsPerSecond)})` : ''
    const cpuPerRound = target.rounds.map((round) => round.serverCpuMicrosPerRequest)
    const cpu = cpuPerRound.every((value) => value !== undefined)
      ? `; server CPU µs/req ${cpuPerRound.map((value) => integer.format(value ?? 0)).join(', ')}`
      : ''
    parts.push(
      `- ${target.label}: req/s ${target.rounds.map((round) => integer.format(round.requestsPerSecond)).join(', ')}` +
        `${warmup}${cpu}`,
    )
  }
  parts.push('', '## What each row runs', '')
  for (const target of report.targets) parts.push(`- **${target.label}** (\`${target.id}\`): ${target.description}`)
  return `${parts.join('\n')}\n`
}
