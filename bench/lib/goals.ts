import type { Goal } from '../targets/types.ts'
import type { TargetSummary } from './stats.ts'

/** Rounds of one target further apart than this (max − min, % of the median) are called noisy. */
export const NOISY_SPREAD_PERCENT = 15

interface Row {
  id: string
  label: string
  summary: TargetSummary
}

interface OpenLoopPhase {
  load: number
  offeredRate: number
  targets: Row[]
}

export interface ThroughputGoalReport {
  kind: 'throughput'
  subject: string
  baseline: string
  minRatio: number
  /** subject ÷ baseline median req/s. */
  ratio: number
  met: boolean
  /** baseline ÷ subject server CPU per request: the same comparison, less sensitive to a busy machine. */
  cpuRatio?: number
  metByCpu?: boolean
  /** Rows whose rounds spread more than NOISY_SPREAD_PERCENT. */
  noisy: string[]
}

export interface RedisCommandsGoalReport {
  kind: 'redis-commands'
  subject: string
  perRequest: number
  /** Median over the rounds of all commands (INFO excluded) per response; undefined without Redis counts. */
  measured?: number
  evalsPerRequest?: number
  /** Everything Redis ran per request, Lua scripts' redis.call commands included. */
  executedPerRequest?: number
  met: boolean
  /** All rounds' commands by name. */
  commands?: Record<string, number>
  /** The server's own counters over all rounds (rate-limit decisions by source, store errors). */
  counters?: Record<string, number>
}

export interface AddedLatencyGoalReport {
  kind: 'added-latency'
  subject: string
  baseline: string
  load: number
  percentile: 'p99'
  maxAddedMillis: number
  offeredRate?: number
  subjectP50?: number
  baselineP50?: number
  subjectP99?: number
  baselineP99?: number
  /** subject p99 − baseline p99, ms (medians over the rounds). */
  added?: number
  met: boolean
}

export type GoalReport = ThroughputGoalReport | RedisCommandsGoalReport | AddedLatencyGoalReport

/** Rounded to two decimals, the measured commands per request equal the goal's. */
function sameAtTwoDecimals(measured: number, expected: number): boolean {
  return Math.round(measured * 100) === Math.round(expected * 100)
}

/** Evaluates the goals whose rows were measured in this run; the others are left out. */
export function evaluateGoals(goals: Goal[], rows: Row[], openLoop: OpenLoopPhase[]): GoalReport[] {
  const summaries = new Map(rows.map((row) => [row.id, row.summary]))
  const reports: GoalReport[] = []
  for (const goal of goals) {
    if (goal.kind === 'throughput') {
      const subject = summaries.get(goal.subject)
      const baseline = summaries.get(goal.baseline)
      if (!subject || !baseline) continue
      const ratio = subject.medianRequestsPerSecond / baseline.medianRequestsPerSecond
      const subjectCpu = subject.medianServerCpuMicrosPerRequest
      const baselineCpu = baseline.medianServerCpuMicrosPerRequest
      const cpuRatio = subjectCpu && baselineCpu ? baselineCpu / subjectCpu : undefined
      reports.push({
        ...goal,
        ratio,
        met: ratio >= goal.minRatio,
        ...(cpuRatio === undefined ? {} : { cpuRatio, metByCpu: cpuRatio >= goal.minRatio }),
        noisy: [goal.subject, goal.baseline].filter((id) => (summaries.get(id)?.spreadPercent ?? 0) > NOISY_SPREAD_PERCENT),
      })
    } else if (goal.kind === 'redis-commands') {
      const subject = summaries.get(goal.subject)
      if (!subject) continue
      const measured = subject.medianRedisCommandsPerRequest
      reports.push({
        ...goal,
        ...(measured === undefined ? {} : { measured }),
        ...(subject.medianRedisEvalsPerRequest === undefined ? {} : { evalsPerRequest: subject.medianRedisEvalsPerRequest }),
        ...(subject.medianRedisExecutedPerRequest === undefined ? {} : { executedPerRequest: subject.medianRedisExecutedPerRequest }),
        ...(subject.redisCommands === undefined ? {} : { commands: subject.redisCommands }),
        ...(subject.counters === undefined ? {} : { counters: subject.counters }),
        met: measured !== undefined && sameAtTwoDecimals(measured, goal.perRequest),
      })
    } else {
      const phase = openLoop.find((candidate) => Math.abs(candidate.load - goal.load) < 1e-9)
      const subject = phase?.targets.find((row) => row.id === goal.subject)?.summary
      const baseline = phase?.targets.find((row) => row.id === goal.baseline)?.summary
      if (!summaries.has(goal.subject) || !summaries.has(goal.baseline)) continue
      if (!phase || !subject || !baseline) {
        reports.push({ ...goal, met: false })
        continue
      }
      const added = subject.medianLatencyP99 - baseline.medianLatencyP99
      reports.push({
        ...goal,
        offeredRate: phase.offeredRate,
        subjectP50: subject.medianLatencyP50,
        baselineP50: baseline.medianLatencyP50,
        subjectP99: subject.medianLatencyP99,
        baselineP99: baseline.medianLatencyP99,
        added,
        met: added <= goal.maxAddedMillis,
      })
    }
  }
  return reports
}
