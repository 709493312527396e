// The subset of autocannon's API (v9, see node_modules/autocannon/README.md) the harness uses.
// autocannon ships no types and @types/autocannon is not a dependency.
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events'

  export interface Options {
    url: string
    connections?: number
    /** Seconds. */
    duration?: number
    pipelining?: number
    /** Seconds a request may take before it counts as a timeout error. */
    timeout?: number
    method?: string
    headers?: Record<string, string>
    body?: string
    title?: string
    /** Milliseconds between samples of the req/s histogram; default 1000. */
    sampleInt?: number
  }

  /** hdr-histogram-percentiles-obj shape; latency values are milliseconds. */
  export interface Histogram {
    average: number
    mean: number
    stddev: number
    min: number
    max: number
    total: number
    p0_001?: number
    p0_01?: number
    p0_1?: number
    p1?: number
    p2_5: number
    p10?: number
    p25?: number
    p50: number
    p75: number
    p90: number
    p97_5: number
    p99: number
    p99_9: number
    p99_99: number
    p99_999: number
    sent?: number
    totalCount?: number
  }

  export interface Result {
    title?: string
    url: string
    connections: number
    pipelining: number
    /** Seconds. */
    duration: number
    samples: number
    start: Date
    finish: Date
    errors: number
    timeouts: number
    mismatches: number
    non2xx: number
    resets: number
    '1xx': number
    '2xx': number
    '3xx': number
    '4xx': number
    '5xx': number
    statusCodeStats: Record<string, { count: number }>
    latency: Histogram
    requests: Histogram
    throughput: Histogram
  }

  export interface Instance extends EventEmitter {
    stop(): void
  }

  export default function autocannon(
    options: Options,
    callback: (error: Error | null, result: Result) => void,
  ): Instance
}
