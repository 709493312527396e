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
  minServerCpuMicrosPerRequest?: number
  maxServerCpuMicrosPerRequest?: number
  medianServerCpuPercent?: number
  medianClientCpuPercent: number
  /** Median share of the machine used by nothing the row measures (other work, kernel softirq), % of one core. */
  medianOtherCpuPercent?: number
  medianPostgresCpuPercent?: number
  medianPostgresCpuMicrosPerRequest?: number
  /** Median CPU µs per request of each supporting process (upstream, Redis). */
  medianSupportingCpuMicrosPerRequest?: Record<string, number>
  /** Median Redis commands per request (all but INFO; EVALSHA + EVAL). */
  medianRedisCommandsPerRequest?: number
  medianRedisEvalsPerRequest?: number
  medianRedisExecutedPerRequest?: number
  /** Redis commands over all rounds, by name. */
  redisCommands?: Record<string, number>
  /** The server's own counters, summed over the rounds. */
  counters?: Record<string, number>
  /** Open loop: medians across rounds. */
  offeredRate?: number
  medianLatencyP90?: number
  medianLatencyP999?: number
  medianServiceLatencyP99?: number
  medianDispatchLagP99?: number
  non2xx: number
  /** Responses with a status other than the target's expected one. */
  unexpected: number
  errors: number
  timeouts: number
}

/** The median of `pick` over the rounds, when every round has it. */
function medianOf(rounds: RoundMeasurement[], pick: (round: RoundMeasurement) => number | undefined): number | undefined {
  const values = rounds.flatMap((round) => pick(round) ?? [])
  return values.length === rounds.length && values.length > 0 ? median(values) : undefined
}

function optional<K extends string>(key: K, value: number | undefined): Partial<Record<K, number>> {
  return value === undefined ? {} : ({ [key]: value } as Record<K, number>)
}

/** Summary of the measured rounds (the warm-up is not passed in). */
export function summarize(rounds: RoundMeasurement[]): TargetSummary {
  const rps = rounds.map((round) => round.requestsPerSecond)
  const medianRps = median(rps)
  const min = Math.min(...rps)
  const max = Math.max(...rps)
  const cpu = rounds.flatMap((round) => round.serverCpuMicrosPerRequest ?? [])
  const roles = [...new Set(rounds.flatMap((round) => Object.keys(round.supportingCpuMicrosPerRequest ?? {})))]
  const supporting = Object.fromEntries(
    roles.flatMap((role) => {
      const value = medianOf(rounds, (round) => round.supportingCpuMicrosPerRequest?.[role])
      return value === undefined ? [] : [[role, value]]
    }),
  )
  const commands: Record<string, number> = {}
  for (const round of rounds) {
    for (const [name, count] of Object.entries(round.redisCommands ?? {})) commands[name] = (commands[name] ?? 0) + count
  }
  const counters: Record<string, number> = {}
  for (const round of rounds) {
    for (const [name, count] of Object.entries(round.counters ?? {})) counters[name] = (counters[name] ?? 0) + count
  }
  return {
    rounds: rounds.length,
    medianRequestsPerSecond: medianRps,
    minRequestsPerSecond: min,
    maxRequestsPerSecond: max,
    spreadPercent: medianRps > 0 ? ((max - min) / medianRps) * 100 : 0,
    medianLatencyP50: median(rounds.map((round) => round.latencyP50)),
    medianLatencyP99: median(rounds.map((round) => round.latencyP99)),
    ...(cpu.length === rounds.length && cpu.length > 0
      ? {
          medianServerCpuMicrosPerRequest: median(cpu),
          minServerCpuMicrosPerRequest: Math.min(...cpu),
          maxServerCpuMicrosPerRequest: Math.max(...cpu),
          ...optional('medianServerCpuPercent', medianOf(rounds, (round) => round.serverCpuPercent)),
        }
      : {}),
    medianClientCpuPercent: median(rounds.map((round) => round.clientCpuPercent)),
    ...optional('medianOtherCpuPercent', medianOf(rounds, (round) => round.otherCpuPercent)),
    ...optional('medianPostgresCpuPercent', medianOf(rounds, (round) => round.postgresCpuPercent)),
    ...optional('medianPostgresCpuMicrosPerRequest', medianOf(rounds, (round) => round.postgresCpuMicrosPerRequest)),
    ...(roles.length === 0 ? {} : { medianSupportingCpuMicrosPerRequest: supporting }),
    ...optional('medianRedisCommandsPerRequest', medianOf(rounds, (round) => round.redisCommandsPerRequest)),
    ...optional('medianRedisEvalsPerRequest', medianOf(rounds, (round) => round.redisEvalsPerRequest)),
    ...optional('medianRedisExecutedPerRequest', medianOf(rounds, (round) => round.redisExecutedPerRequest)),
    ...(Object.keys(commands).length === 0 && !rounds.some((round) => round.redisCommands) ? {} : { redisCommands: commands }),
    ...(rounds.some((round) => round.counters) ? { counters } : {}),
    ...optional('offeredRate', medianOf(rounds, (round) => round.offeredRate)),
    ...optional('medianLatencyP90', medianOf(rounds, (round) => round.latencyP90)),
    ...optional('medianLatencyP999', medianOf(rounds, (round) => round.latencyP999)),
    ...optional('medianServiceLatencyP99', medianOf(rounds, (round) => round.serviceLatencyP99)),
    ...optional('medianDispatchLagP99', medianOf(rounds, (round) => round.dispatchLagP99)),
    non2xx: rounds.reduce((sum, round) => sum + round.non2xx, 0),
    unexpected: rounds.reduce((sum, round) => sum + round.unexpected, 0),
    errors: rounds.reduce((sum, round) => sum + round.errors, 0),
    timeouts: rounds.reduce((sum, round) => sum + round.timeouts, 0),
  }
}
