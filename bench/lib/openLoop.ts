import { performance } from 'node:perf_hooks'
import { Pool, type Dispatcher } from 'undici'

/**
 * An open-loop load generator: requests leave on a fixed schedule (one every 1/rate seconds,
 * evenly spaced), whether or not earlier ones have been answered, over a pool of keep-alive
 * connections (pipelining 1; a request waits in the pool's queue when all are busy). Latency is
 * measured from each request's scheduled send time, so time spent queued behind a slow answer
 * counts (coordinated omission corrected, as wrk2 does); `service` latency is from the moment
 * the request was actually handed to a connection.
 *
 * Why not autocannon's `overallRate`: autocannon gives each connection a quota per second and
 * sends it back to back from the start of each second, then idles. At half the saturation rate
 * that is a closed loop at full concurrency for half of every second, and its p99 is the
 * saturated p99, not the p99 at that load.
 */
export interface OpenLoopOptions {
  url: string
  method?: string
  headers: Record<string, string>
  body?: string
  ratePerSecond: number
  durationSeconds: number
  connections: number
  /** Seconds before a request counts as timed out. */
  timeoutSeconds?: number
}

export interface LatencyPercentiles {
  p50: number
  p90: number
  p99: number
  p999: number
  max: number
  mean: number
}

export interface OpenLoopResult {
  offeredRate: number
  /** Requests scheduled (and sent) in the run. */
  sent: number
  /** Responses received. */
  responses: number
  durationSeconds: number
  statusCodes: Record<string, number>
  errors: number
  timeouts: number
  /** Milliseconds from the scheduled send time to the end of the response body. */
  latency: LatencyPercentiles
  /** Milliseconds from the actual send to the end of the response body. */
  service: LatencyPercentiles
  /** How late the generator itself dispatched requests against the schedule (its own timer lag), ms. */
  dispatchLagP99: number
}

export interface OpenLoopRun {
  result: Promise<OpenLoopResult>
  stop(): void
}

function percentiles(values: Float64Array): LatencyPercentiles {
  if (values.length === 0) return { p50: 0, p90: 0, p99: 0, p999: 0, max: 0, mean: 0 }
  const sorted = values.slice().sort()
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? 0
  const round = (ms: number) => Math.round(ms * 100) / 100
  let sum = 0
  for (const value of sorted) sum += value
  return {
    p50: round(at(0.5)),
    p90: round(at(0.9)),
    p99: round(at(0.99)),
    p999: round(at(0.999)),
    max: round(sorted[sorted.length - 1] ?? 0),
    mean: round(sum / sorted.length),
  }
}

export function startOpenLoop(options: OpenLoopOptions): OpenLoopRun {
  const url = new URL(options.url)
  const path = `${url.pathname}${url.search}`
  const timeoutMillis = (options.timeoutSeconds ?? 10) * 1_000
  const pool = new Pool(url.origin, {
    connections: options.connections,
    pipelining: 1,
    keepAliveTimeout: 60_000,
    headersTimeout: timeoutMillis,
    bodyTimeout: timeoutMillis,
  })
  const total = Math.max(1, Math.floor(options.ratePerSecond * options.durationSeconds))
  const interval = 1_000 / options.ratePerSecond
  const latency = new Float64Array(total)
  const service = new Float64Array(total)
  const lag = new Float64Array(total)
  const statusCodes: Record<string, number> = {}
  let stopped = false
  let sent = 0
  let responses = 0
  let errors = 0
  let timeouts = 0
  let settled = 0
  let begin = 0
  let finish: () => void = () => undefined
  const allSettled = new Promise<void>((resolve) => (finish = resolve))

  const method = (options.method ?? 'GET') as Dispatcher.HttpMethod
  const body = options.body ?? null

  /** One request through a bare dispatch handler: no response stream, no promise (the generator stays light). */
  function send(onDone: (statusCode: number | undefined, error?: Error) => void): void {
    let statusCode: number | undefined
    pool.dispatch(
      { path, method, headers: options.headers, body },
      {
        onConnect: () => undefined,
        onHeaders: (status) => {
          if (status >= 200) statusCode = status
          return true
        },
        onData: () => true,
        onComplete: () => onDone(statusCode),
        onError: (error) => onDone(undefined, error),
      },
    )
  }

  function fire(index: number, scheduled: number): void {
    const dispatched = performance.now()
    lag[index] = dispatched - scheduled
    send((statusCode, error) => {
      if (statusCode !== undefined && error === undefined) {
        const done = performance.now()
        latency[responses] = done - scheduled
        service[responses] = done - dispatched
        responses += 1
        statusCodes[statusCode] = (statusCodes[statusCode] ?? 0) + 1
      } else {
        errors += 1
        const code = (error as { code?: unknown } | undefined)?.code
        if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') timeouts += 1
      }
      settled += 1
      if (settled === sent && (stopped || sent === total)) finish()
    })
  }

  function tick(): void {
    const now = performance.now()
    while (!stopped && sent < total && begin + sent * interval <= now) {
      fire(sent, begin + sent * interval)
      sent += 1
    }
    if (stopped || sent === total) {
      if (settled === sent) finish()
      return
    }
    setTimeout(tick, Math.max(0, begin + sent * interval - performance.now()))
  }

  const result = (async (): Promise<OpenLoopResult> => {
    // Open the connections first so the schedule does not start with connection set-up.
    await Promise.all(Array.from({ length: options.connections }, () => new Promise<void>((resolve) => send(() => resolve()))))
    begin = performance.now()
    tick()
    await allSettled
    const durationSeconds = (performance.now() - begin) / 1_000
    await pool.close().catch(() => undefined)
    return {
      offeredRate: options.ratePerSecond,
      sent,
      responses,
      durationSeconds,
      statusCodes,
      errors,
      timeouts,
      latency: percentiles(latency.subarray(0, responses)),
      service: percentiles(service.subarray(0, responses)),
      dispatchLagP99: percentiles(lag.subarray(0, sent)).p99,
    }
  })()
  return {
    result,
    stop: () => {
      stopped = true
    },
  }
}
