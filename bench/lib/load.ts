import autocannon, { type Result } from 'autocannon'
import type { OpenLoopResult } from './openLoop.ts'

export interface LoadOptions {
  url: string
  method?: string
  headers: Record<string, string>
  body?: string
  connections: number
  durationSeconds: number
  /** autocannon's overallRate (requests per second over all connections); closed loop when unset. */
  overallRate?: number
}

export interface LoadRun<T = Result> {
  result: Promise<T>
  /** Ends the run early; `result` still resolves with what was measured. */
  stop(): void
}

/** One autocannon run in this process (one thread; pipelining 1; keep-alive connections). */
export function startLoad(options: LoadOptions): LoadRun {
  let stop: () => void = () => undefined
  const result = new Promise<Result>((resolve, reject) => {
    const instance = autocannon(
      {
        url: options.url,
        method: options.method ?? 'GET',
        headers: options.headers,
        ...(options.body === undefined ? {} : { body: options.body }),
        connections: options.connections,
        duration: options.durationSeconds,
        pipelining: 1,
        timeout: 10,
        ...(options.overallRate === undefined ? {} : { overallRate: options.overallRate }),
      },
      (error, outcome) => (error ? reject(error) : resolve(outcome)),
    )
    stop = () => instance.stop()
  })
  return { result, stop: () => stop() }
}

/** CPU and Redis usage around one round, as raw totals (seconds, command calls). */
export interface RoundUsage {
  clientCpuSeconds: number
  serverCpuSeconds?: number
  postgresCpuSeconds?: number
  /** CPU seconds per supporting role ("upstream", "Redis"). */
  supportingCpuSeconds: Record<string, number>
  /** Redis command calls during the round, by command (INFO, the harness's own, left out). */
  redisCommands?: Record<string, number>
  /** Busy CPU seconds of the whole machine during the round (all cores). */
  machineCpuSeconds?: number
  /**
   * Commands Lua scripts run per EVALSHA/EVAL for this row (from its MONITOR sample): Redis counts
   * them in commandstats too, and they are subtracted to get the commands clients sent.
   */
  scriptCallsPerEval?: Record<string, number>
  /** Deltas of the target's own counters over the round (RunningTarget.counters). */
  counters?: Record<string, number>
}

export interface RoundMeasurement {
  /** 0 for the warm-up. */
  round: number
  requestsPerSecond: number
  /** Milliseconds (every response, whatever its status). */
  latencyP50: number
  latencyP99: number
  latencyAverage: number
  latencyMax: number
  requests: number
  non2xx: number
  /** Responses whose status is not the target's expected one (any 2xx when it names none). */
  unexpected: number
  errors: number
  timeouts: number
  statusCodes: Record<string, number>
  durationSeconds: number
  /** CPU time the target's server processes used per response, microseconds (Linux only). */
  serverCpuMicrosPerRequest?: number
  /** The servers' CPU use during the round, percent of one core. */
  serverCpuPercent?: number
  /** This process's CPU use (the load generator) during the round, percent of one core: near 100 means the
   * load generator, not the server, limited the rate. */
  clientCpuPercent: number
  /** The benchmark database's Postgres backends during the round, % of one core (local Postgres only). */
  postgresCpuPercent?: number
  postgresCpuMicrosPerRequest?: number
  /** CPU µs per response of each supporting process (the upstream, Redis). */
  supportingCpuMicrosPerRequest?: Record<string, number>
  /**
   * Redis commands the clients sent per response (round trips; commandstats minus what the scripts
   * ran, INFO excluded), EVALSHA + EVAL among them, and everything Redis executed (scripts' inner
   * commands included).
   */
  redisCommandsPerRequest?: number
  redisEvalsPerRequest?: number
  redisExecutedPerRequest?: number
  redisCommands?: Record<string, number>
  /**
   * The machine's busy CPU during the round that none of the measured processes (server, supporting,
   * Postgres backends, load generator) account for, % of one core: other people's work on a shared
   * machine, plus the kernel's softirq work for loopback traffic.
   */
  otherCpuPercent?: number
  /** Deltas of the server's own counters over the round (e.g. rate-limit decisions by source). */
  counters?: Record<string, number>
  /** Open loop only: the offered rate, the p90 / p99.9 and the service (send → answer) percentiles. */
  offeredRate?: number
  latencyP90?: number
  latencyP999?: number
  serviceLatencyP50?: number
  serviceLatencyP99?: number
  dispatchLagP99?: number
}

function unexpectedCount(statusCodes: Record<string, number>, expectedStatus: number | undefined): number {
  let unexpected = 0
  for (const [code, count] of Object.entries(statusCodes)) {
    const status = Number(code)
    const fine = expectedStatus === undefined ? status >= 200 && status < 300 : status === expectedStatus
    if (!fine) unexpected += count
  }
  return unexpected
}

function usageFields(usage: RoundUsage, requests: number, durationSeconds: number) {
  const perRequest = (seconds: number) => (seconds / requests) * 1e6
  const supporting = Object.entries(usage.supportingCpuSeconds)
  const commands = usage.redisCommands
  const all = commands === undefined ? 0 : Object.values(commands).reduce((sum, count) => sum + count, 0)
  const evals = commands === undefined ? 0 : (commands.evalsha ?? 0) + (commands.eval ?? 0)
  const insideScripts = Object.values(usage.scriptCallsPerEval ?? {}).reduce((sum, perEval) => sum + perEval * evals, 0)
  // Redis's counters also hold the commands of the requests still in flight when the round
  // stopped (up to one per connection), whose responses the load generator never counted. The
  // server's own count of rate-limit decisions covers exactly the requests it sent commands for.
  const decided = Object.entries(usage.counters ?? {})
    .filter(([name]) => name.startsWith('decisions from '))
    .reduce((sum, [, count]) => sum + count, 0)
  const commandsPer = decided > 0 ? decided : requests
  const accounted =
    usage.clientCpuSeconds +
    (usage.serverCpuSeconds ?? 0) +
    (usage.postgresCpuSeconds ?? 0) +
    supporting.reduce((sum, [, seconds]) => sum + seconds, 0)
  return {
    ...(usage.counters === undefined ? {} : { counters: usage.counters }),
    ...(usage.machineCpuSeconds === undefined || durationSeconds <= 0
      ? {}
      : { otherCpuPercent: Math.max(0, ((usage.machineCpuSeconds - accounted) / durationSeconds) * 100) }),
    clientCpuPercent: durationSeconds > 0 ? (usage.clientCpuSeconds / durationSeconds) * 100 : 0,
    ...(usage.postgresCpuSeconds === undefined || durationSeconds <= 0
      ? {}
      : { postgresCpuPercent: (usage.postgresCpuSeconds / durationSeconds) * 100 }),
    ...(usage.postgresCpuSeconds === undefined || requests === 0
      ? {}
      : { postgresCpuMicrosPerRequest: perRequest(usage.postgresCpuSeconds) }),
    ...(usage.serverCpuSeconds === undefined || requests === 0
      ? {}
      : {
          serverCpuMicrosPerRequest: perRequest(usage.serverCpuSeconds),
          serverCpuPercent: durationSeconds > 0 ? (usage.serverCpuSeconds / durationSeconds) * 100 : 0,
        }),
    ...(supporting.length === 0 || requests === 0
      ? {}
      : { supportingCpuMicrosPerRequest: Object.fromEntries(supporting.map(([role, seconds]) => [role, perRequest(seconds)])) }),
    ...(commands === undefined || requests === 0
      ? {}
      : {
          redisCommands: commands,
          redisCommandsPerRequest: Math.max(0, all - insideScripts) / commandsPer,
          redisEvalsPerRequest: evals / commandsPer,
          redisExecutedPerRequest: all / commandsPer,
        }),
  }
}

/** A closed-loop (autocannon) round. */
export function measurement(round: number, result: Result, usage: RoundUsage, expectedStatus?: number): RoundMeasurement {
  const statusCodes = Object.fromEntries(
    Object.entries(result.statusCodeStats).map(([code, { count }]) => [code, count]),
  )
  const requests = result.requests.total
  return {
    round,
    requestsPerSecond: result.duration > 0 ? requests / result.duration : 0,
    latencyP50: result.latency.p50,
    latencyP99: result.latency.p99,
    latencyAverage: result.latency.average,
    latencyMax: result.latency.max,
    requests,
    non2xx: result.non2xx,
    unexpected: unexpectedCount(statusCodes, expectedStatus),
    errors: result.errors,
    timeouts: result.timeouts,
    statusCodes,
    durationSeconds: result.duration,
    ...usageFields(usage, requests, result.duration),
  }
}

/** An open-loop round (bench/lib/openLoop.ts). */
export function openLoopMeasurement(round: number, result: OpenLoopResult, usage: RoundUsage, expectedStatus?: number): RoundMeasurement {
  const requests = result.responses
  const non2xx = Object.entries(result.statusCodes)
    .filter(([code]) => Number(code) < 200 || Number(code) >= 300)
    .reduce((sum, [, count]) => sum + count, 0)
  return {
    round,
    requestsPerSecond: result.durationSeconds > 0 ? requests / result.durationSeconds : 0,
    latencyP50: result.latency.p50,
    latencyP99: result.latency.p99,
    latencyAverage: result.latency.mean,
    latencyMax: result.latency.max,
    requests,
    non2xx,
    unexpected: unexpectedCount(result.statusCodes, expectedStatus),
    errors: result.errors,
    timeouts: result.timeouts,
    statusCodes: result.statusCodes,
    durationSeconds: result.durationSeconds,
    offeredRate: result.offeredRate,
    latencyP90: result.latency.p90,
    latencyP999: result.latency.p999,
    serviceLatencyP50: result.service.p50,
    serviceLatencyP99: result.service.p99,
    dispatchLagP99: result.dispatchLagP99,
    ...usageFields(usage, requests, result.durationSeconds),
  }
}

/** An autocannon overallRate round (the experiment BENCH_OPEN_LOOP_TOOL=autocannon). */
export function autocannonRateMeasurement(round: number, result: Result, usage: RoundUsage, offeredRate: number, expectedStatus?: number): RoundMeasurement {
  return {
    ...measurement(round, result, usage, expectedStatus),
    offeredRate,
    latencyP90: result.latency.p90,
    latencyP999: result.latency.p99_9,
  }
}
