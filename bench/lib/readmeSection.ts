/**
 * The README's benchmark results, rendered from a run's report (bench/results/latest.json) so the
 * README never drifts from latest.md: the command, the machine and the date, the chart, throughput
 * at every level of connections, open-loop latency, and the targets met and missed.
 * `npm run bench:readme` writes it between the README's `bench:results` markers.
 */
import type { GoalReport } from './goals.ts'
import { otherCpuPercent, type BenchReport } from './report.ts'

export const README_START = '<!-- bench:results:start (npm run bench:readme writes this part) -->'
export const README_END = '<!-- bench:results:end -->'

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })
const ms = (value: number | undefined) => (value === undefined || !Number.isFinite(value) ? 'n/a' : String(Math.round(value * 10) / 10))
const ratio = (value: number | undefined) => (value === undefined || !Number.isFinite(value) ? 'n/a' : `${value.toFixed(2)}×`)

function labelOf(report: BenchReport, id: string): string {
  return report.targets.find((target) => target.id === id)?.label ?? id
}

function goalLine(report: BenchReport, goal: GoalReport): string {
  if (goal.kind === 'throughput') {
    return (
      `${labelOf(report, goal.subject)} ≥ ${goal.minRatio}× ${labelOf(report, goal.baseline)}: ${ratio(goal.ratio)} by req/s` +
      (goal.cpuRatio === undefined ? '' : `, ${ratio(goal.cpuRatio)} by server CPU per request`)
    )
  }
  if (goal.kind === 'redis-commands') {
    return `${labelOf(report, goal.subject)}: ${goal.perRequest} Redis command${goal.perRequest === 1 ? '' : 's'} per request (measured ${goal.measured === undefined ? 'n/a' : goal.measured.toFixed(2)})`
  }
  return (
    `${labelOf(report, goal.subject)} p99 within ${goal.maxAddedMillis} ms of ${labelOf(report, goal.baseline)}'s at ` +
    `${Math.round(goal.load * 100)} % of its saturation rate (${goal.added === undefined ? 'not measured' : `${goal.added >= 0 ? '+' : ''}${ms(goal.added)} ms`})`
  )
}

function met(goal: GoalReport): boolean {
  return goal.kind === 'throughput' ? goal.met || goal.metByCpu === true : goal.met
}

/** Fewer or shorter rounds than a default full run. */
function shortRun(report: BenchReport): boolean {
  const { config } = report
  return config.rounds < 5 || config.durationSeconds < 5 || config.warmupSeconds < 5
}

export function renderReadmeSection(report: BenchReport): string {
  const env = report.environment
  const other = otherCpuPercent(report)
  const levels = [...new Set(report.targets.flatMap((target) => (target.sweep ?? []).map((level) => level.connections)))].sort((a, b) => a - b)
  const lines: string[] = [
    `Last run: \`${report.command}\`, ${report.startedAt.slice(0, 16).replace('T', ' ')} UTC, Node ${env.node.replace(/^v/, '')}, ` +
      `${env.cores} × ${env.cpuModel}, ${env.memoryGiB} GiB, commit ${env.gitCommit}. Load average ${env.loadAverageAtStart} at the start` +
      (other === undefined ? '.' : `; other work on the machine used a median of ${integer.format(other)} % of one core during the rounds.`) +
      ' Every row was measured in the same run, in interleaved rounds; `bench/results/latest.md` has every column, spread and round.' +
      (shortRun(report)
        ? ' **This was a short run** (rounds shorter or fewer than the defaults): its spreads are wide; the numbers to quote come from a full `npm run bench` on a quiet machine.'
        : ''),
    '',
    '![Throughput per row at 1, 10 and 100 connections, and open-loop latency per offered load](bench/results/latest.svg)',
    '',
    `| row | req/s at ${levels.join(' / ')} connections | spread at ${report.config.connections} | server CPU µs/req | Redis commands/req |`,
    '|---|---:|---:|---:|---:|',
  ]
  for (const target of report.targets) {
    if (target.skipped !== undefined) {
      lines.push(`| ${target.label} | skipped: ${target.skipped} | – | – | – |`)
      continue
    }
    const rates = levels.map((connections) => {
      const level = target.sweep?.find((candidate) => candidate.connections === connections)
      return level && level.rounds.length > 0 ? integer.format(level.summary.medianRequestsPerSecond) : 'n/a'
    })
    const s = target.summary
    lines.push(
      `| ${target.label}${target.expectedStatus === undefined ? '' : ` (→ ${target.expectedStatus})`} | ${rates.join(' / ')} | ` +
        `${Math.round(s.spreadPercent)} % | ${s.medianServerCpuMicrosPerRequest === undefined ? 'n/a' : integer.format(s.medianServerCpuMicrosPerRequest)} | ` +
        `${s.medianRedisCommandsPerRequest === undefined ? '–' : s.medianRedisCommandsPerRequest.toFixed(2)} |`,
    )
  }
  const phases = report.openLoop ?? []
  if (phases.length > 0) {
    const rows = phases[0]?.targets.map((entry) => entry.id) ?? []
    lines.push(
      '',
      `Open loop (latency from each request's scheduled send, ms, p50 / p99), offered a fixed share of ${labelOf(report, phases[0]?.baseline ?? '')}'s saturation rate:`,
      '',
      `| row | ${phases.map((phase) => `${Math.round(phase.load * 100)} % (${integer.format(phase.offeredRate)} req/s)`).join(' | ')} |`,
      `|---|${phases.map(() => '---:').join('|')}|`,
      ...rows.map((id) => {
        const cells = phases.map((phase) => {
          const summary = phase.targets.find((entry) => entry.id === id)?.summary
          return summary ? `${ms(summary.medianLatencyP50)} / ${ms(summary.medianLatencyP99)}` : 'n/a'
        })
        return `| ${labelOf(report, id)} | ${cells.join(' | ')} |`
      }),
    )
  }
  const metGoals = report.goals.filter(met)
  const missed = report.goals.filter((goal) => !met(goal))
  lines.push('', `**Targets met** (at ${report.config.connections} connections; by req/s or by server CPU per request):`, '')
  lines.push(...(metGoals.length === 0 ? ['- none'] : metGoals.map((goal) => `- ${goalLine(report, goal)}`)))
  lines.push('', '**Targets missed:**', '')
  lines.push(...(missed.length === 0 ? ['- none'] : missed.map((goal) => `- ${goalLine(report, goal)}`)))
  if (report.problems.length > 0) lines.push('', `**This run had problems** (its numbers are not valid): ${report.problems.join('; ')}`)
  return lines.join('\n')
}

/** `readme` with the text between the markers replaced; an error when the markers are missing. */
export function replaceReadmeSection(readme: string, section: string): string {
  const start = readme.indexOf(README_START)
  const end = readme.indexOf(README_END)
  if (start === -1 || end === -1 || end < start) throw new Error(`README.md has no ${README_START} … ${README_END} markers in its Benchmark section`)
  return `${readme.slice(0, start + README_START.length)}\n${section}\n${readme.slice(end)}`
}
