import type { RoundMeasurement } from './load.ts'

export function median(values: number[]): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  const upper = sorted[middle] as number
  return sorted.length % 2 === 1 ? upper : ((sorted[middle - 1] as number) + upper) / 2
}

export interface TargetSummary {
  rounds: number
  medianRequestsPerSecond: number
  minRequestsPerSecond: number
  maxRequestsPerSecond: number
  /** (max − min) / median, in percent. */
  spreadPercent: number
  /** Medians across rounds of each round's p50 / p99, milliseconds. */
  medianLatencyP50: number
  medianLatencyP99: number
  /** Median across rounds of the servers' CPU microseconds per request (undefined off Linux). */
  medianServerCpuMicrosPerRequest?: number
  medianServerCpuPercent?: number
  medianClientCpuPercent: number
  medianPostgresCpuPercent?: number
  non2xx: number
  errors: number
  timeouts: number
}

/** Summary of the measured rounds (the warm-up is not passed in). */
export function summarize(rounds: RoundMeasurement[]): TargetSummary {
  const rps = rounds.map((round) => round.requestsPerSecond)
  const medianRps = median(rps)
  const min = Math.min(...rps)
  const max = Math.max(...rps)
  const cpu = rounds.flatMap((round) => round.serverCpuMicrosPerRequest ?? [])
  const cpuPercent = rounds.flatMap((round) => round.serverCpuPercent ?? [])
  const postgres = rounds.flatMap((round) => round.postgresCpuPercent ?? [])
  return {
    rounds: rounds.length,
    medianRequestsPerSecond: medianRps,
    minRequestsPerSecond: min,
    maxRequestsPerSecond: max,
    spreadPercent: medianRps > 0 ? ((max - min) / medianRps) * 100 : 0,
    medianLatencyP50: median(rounds.map((round) => round.latencyP50)),
    medianLatencyP99: median(rounds.map((round) => round.latencyP99)),
    ...(cpu.length === rounds.length && cpu.length > 0
      ? { medianServerCpuMicrosPerRequest: median(cpu), medianServerCpuPercent: median(cpuPercent) }
      : {}),
    medianClientCpuPercent: median(rounds.map((round) => round.clientCpuPercent)),
    ...(postgres.length === rounds.length && postgres.length > 0 ? { medianPostgresCpuPercent: median(postgres) } : {}),
    non2xx: rounds.reduce((sum, round) => sum + round.non2xx, 0),
    errors: rounds.reduce((sum, round) => sum + round.errors, 0),
    timeouts: rounds.reduce((sum, round) => sum + round.timeouts, 0),
  }
}
