import type { RedisProbe } from '../lib/redisServer.ts'

/**
 * A benchmark target: something the harness can start, load with one request shape, and stop.
 * Add a row to the table by writing a module that exports a `BenchTarget` and listing it in
 * bench/suite.ts.
 */

/** A process started once per run and used by several targets (the static upstream, Redis, …). */
export interface SharedService {
  pid: number
  /** Why the service died mid-run, or undefined while it is fine. */
  failure(): string | undefined
  stop(): Promise<void>
}

export interface TargetContext {
  /** The throwaway, migrated and seeded benchmark database. */
  databaseUrl: string
  /** Where server logs go (a temporary folder, deleted at the end unless BENCH_KEEP_LOGS=1). */
  logDir: string
  /** Extra node flags for server child processes (BENCH_NODE_ARGS). */
  nodeArgs: string[]
  /**
   * Starts a shared service the first time `id` is asked for and hands every later caller the
   * same instance; the harness stops it at the end, after every target.
   */
  shared<T extends SharedService>(id: string, start: () => Promise<T>): Promise<T>
}

export interface ResponseSample {
  status: number
  headers: Headers
  body: string
}

/** A process the target's requests also cost (its upstream, Redis), measured per round. */
export interface SupportingProcess {
  /** Column it is reported in: "upstream", "Redis". */
  role: 'upstream' | 'Redis'
  pid: number
}

export interface RunningTarget {
  /** The full URL the load generators request. */
  url: string
  method?: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'
  headers: Record<string, string>
  body?: string
  /** Processes whose CPU time is this target's cost (server children), for CPU per request. */
  pids: number[]
  /** Processes the request also passes through; their CPU per request is reported separately. */
  supporting?: SupportingProcess[]
  /**
   * When the target uses the private Redis: its command counts, read before and after each round,
   * and a MONITOR sample that tells the commands clients send from those scripts run.
   */
  redis?: RedisProbe
  /**
   * Counters the server keeps (e.g. rate-limit decisions by source from its /metrics), read
   * before and after each round; the report shows each round's deltas.
   */
  counters?: () => Promise<Record<string, number>>
  /** Why the target died mid-run (child process gone), or undefined while it is fine. */
  failure(): string | undefined
  stop(): Promise<void>
}

export interface BenchTarget {
  /** Stable id: used by BENCH_TARGETS, goals and the JSON output. */
  id: string
  /** Row label in the table. */
  label: string
  /** What one request is, for the table ("GET /pets?limit=20"). */
  request: string
  /** One-line description for the report (what is in the path, what is not). */
  description: string
  /**
   * The status every response must have; anything else makes the run invalid. Default: any 2xx.
   * Rows that measure refusals (401, 429) name theirs.
   */
  expectedStatus?: number
  /**
   * Also measured in the open-loop phase (a fixed offered rate, a fraction of a baseline's
   * saturation rate) for latency under load.
   */
  openLoop?: boolean
  /**
   * Why this row cannot run on this machine (e.g. nginx is not installed), or undefined when it
   * can: an unavailable row is listed as skipped in every table and never started.
   */
  unavailable?(): string | undefined
  start(context: TargetContext): Promise<RunningTarget>
  /**
   * Checked once on a single request before the warm-up: returns a problem description, or
   * undefined when the response is what the benchmark means to measure.
   */
  checkResponse?(response: ResponseSample): string | undefined
}

/** "subject reaches at least minRatio × baseline throughput" (median req/s; CPU per request shown too). */
export interface ThroughputGoal {
  kind: 'throughput'
  subject: string
  baseline: string
  minRatio: number
}

/** "subject sends exactly `perRequest` Redis commands per response" (all commands but INFO). */
export interface RedisCommandsGoal {
  kind: 'redis-commands'
  subject: string
  perRequest: number
}

/**
 * "At `load` × baseline's saturation rate (its median closed-loop req/s), both offered the same
 * rate, subject's p99 is at most `maxAddedMillis` above baseline's."
 */
export interface AddedLatencyGoal {
  kind: 'added-latency'
  subject: string
  baseline: string
  load: number
  percentile: 'p99'
  maxAddedMillis: number
}

export type Goal = ThroughputGoal | RedisCommandsGoal | AddedLatencyGoal
