import type { BenchConfig } from './config.ts'

/** One closed-loop level of the sweep: how many connections, how many rounds of how long. */
export interface SweepPoint {
  connections: number
  rounds: number
  durationSeconds: number
  /** The level the table's main columns and the targets read (BenchConfig.connections). */
  goal: boolean
}

type SweepConfig = Pick<BenchConfig, 'connectionLevels' | 'connections' | 'rounds' | 'durationSeconds' | 'sweepRounds' | 'sweepDurationSeconds'>

/**
 * The closed-loop levels in ascending order of connections. The goal level gets the full
 * BENCH_ROUNDS × BENCH_DURATION_SECONDS; the others the (usually fewer, shorter) sweep rounds, whose
 * spread the report prints beside each figure.
 */
export function planSweep(config: SweepConfig): SweepPoint[] {
  const levels = [...new Set([...config.connectionLevels, config.connections])].sort((a, b) => a - b)
  return levels.map((connections) => {
    const goal = connections === config.connections
    return {
      connections,
      rounds: goal ? config.rounds : config.sweepRounds,
      durationSeconds: goal ? config.durationSeconds : config.sweepDurationSeconds,
      goal,
    }
  })
}

/** One load step of a run, in the order the runner takes them. */
export interface PlannedStep {
  phase: 'warm-up' | 'closed' | 'open'
  /** Index into the measured targets (closed loop, warm-up) or the open-loop targets (open). */
  target: number
  connections: number
  /** 1-based; 0 for the warm-up. */
  round: number
  rounds: number
  seconds: number
  /** Open loop: fraction of the baseline's saturation rate. */
  load?: number
}

type PlanConfig = SweepConfig & Pick<BenchConfig, 'warmupSeconds' | 'openLoopLoads' | 'openLoopRounds'>

/**
 * Every load step in order: warm-up per target (at the goal level), then per sweep level its
 * rounds with the targets interleaved (A, B, A, B, …), then per open-loop load its rounds with the
 * open-loop targets interleaved. The progress bar's ETA is the sum of what is left.
 */
export function planSteps(config: PlanConfig, targets: number, openTargets: number): PlannedStep[] {
  const steps: PlannedStep[] = []
  if (config.warmupSeconds > 0) {
    for (let target = 0; target < targets; target += 1) {
      steps.push({ phase: 'warm-up', target, connections: config.connections, round: 0, rounds: 0, seconds: config.warmupSeconds })
    }
  }
  for (const point of planSweep(config)) {
    for (let round = 1; round <= point.rounds; round += 1) {
      for (let target = 0; target < targets; target += 1) {
        steps.push({ phase: 'closed', target, connections: point.connections, round, rounds: point.rounds, seconds: point.durationSeconds })
      }
    }
  }
  for (const load of openTargets > 0 ? config.openLoopLoads : []) {
    for (let round = 1; round <= config.openLoopRounds; round += 1) {
      for (let target = 0; target < openTargets; target += 1) {
        steps.push({
          phase: 'open',
          target,
          connections: config.connections,
          round,
          rounds: config.openLoopRounds,
          seconds: config.durationSeconds,
          load,
        })
      }
    }
  }
  return steps
}

/** Seconds between two load steps spent reading /proc, /metrics and INFO (measured: about 0.3 s). */
export const STEP_OVERHEAD_SECONDS = 0.3

/** What the planned steps take, load plus the harness's own time between them. */
export function plannedSeconds(steps: PlannedStep[], overheadSeconds = STEP_OVERHEAD_SECONDS): number {
  return steps.reduce((sum, step) => sum + step.seconds + overheadSeconds, 0)
}
