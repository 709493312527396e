import autocannon, { type Result } from 'autocannon'

export interface LoadOptions {
  url: string
  method?: string
  headers: Record<string, string>
  body?: string
  connections: number
  durationSeconds: number
}

export interface LoadRun {
  result: Promise<Result>
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
      },
      (error, outcome) => (error ? reject(error) : resolve(outcome)),
    )
    stop = () => instance.stop()
  })
  return { result, stop: () => stop() }
}

export interface RoundMeasurement {
  /** 0 for the warm-up. */
  round: number
  requestsPerSecond: number
  /** Milliseconds (autocannon's 2xx latency histogram). */
  latencyP50: number
  latencyP99: number
  latencyAverage: number
  latencyMax: number
  requests: number
  non2xx: number
  errors: number
  timeouts: number
  statusCodes: Record<string, number>
  durationSeconds: number
  /** CPU time the target's server processes used per response, microseconds (Linux only). */
  serverCpuMicrosPerRequest?: number
  /** The servers' CPU use during the round, percent of one core. */
  serverCpuPercent?: number
  /** This process's CPU use (autocannon) during the round, percent of one core: near 100 means the
   * load generator, not the server, limited the rate. */
  clientCpuPercent: number
  /** The benchmark database's Postgres backends during the round, % of one core (local Postgres only). */
  postgresCpuPercent?: number
}

export function measurement(
  round: number,
  result: Result,
  clientCpuSeconds: number,
  serverCpuSeconds?: number,
  postgresCpuSeconds?: number,
): RoundMeasurement {
  const statusCodes = Object.fromEntries(
    Object.entries(result.statusCodeStats).map(([code, { count }]) => [code, count]),
  )
  return {
    round,
    requestsPerSecond: result.duration > 0 ? result.requests.total / result.duration : 0,
    latencyP50: result.latency.p50,
    latencyP99: result.latency.p99,
    latencyAverage: result.latency.average,
    latencyMax: result.latency.max,
    requests: result.requests.total,
    non2xx: result.non2xx,
    errors: result.errors,
    timeouts: result.timeouts,
    statusCodes,
    durationSeconds: result.duration,
    clientCpuPercent: result.duration > 0 ? (clientCpuSeconds / result.duration) * 100 : 0,
    ...(postgresCpuSeconds === undefined || result.duration <= 0
      ? {}
      : { postgresCpuPercent: (postgresCpuSeconds / result.duration) * 100 }),
    ...(serverCpuSeconds === undefined || result.requests.total === 0
      ? {}
      : {
          serverCpuMicrosPerRequest: (serverCpuSeconds / result.requests.total) * 1e6,
          serverCpuPercent: result.duration > 0 ? (serverCpuSeconds / result.duration) * 100 : 0,
        }),
  }
}
