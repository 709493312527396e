/**
 * A benchmark target: something the harness can start, load with one request shape, and stop.
 * Add a row to the table by writing a module that exports a `BenchTarget` and listing it in
 * bench/suite.ts.
 */
export interface TargetContext {
  /** The throwaway, migrated and seeded benchmark database. */
  databaseUrl: string
  /** Where server logs go (a temporary folder, deleted at the end unless BENCH_KEEP_LOGS=1). */
  logDir: string
  /** Extra node flags for server child processes (BENCH_NODE_ARGS). */
  nodeArgs: string[]
}

export interface ResponseSample {
  status: number
  headers: Headers
  body: string
}

export interface RunningTarget {
  /** The full URL autocannon requests. */
  url: string
  method?: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'
  headers: Record<string, string>
  body?: string
  /** Processes whose CPU time is this target's cost (server children), for CPU per request. */
  pids: number[]
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
  start(context: TargetContext): Promise<RunningTarget>
  /**
   * Checked once on a single request before the warm-up: returns a problem description, or
   * undefined when the response is what the benchmark means to measure.
   */
  checkResponse?(response: ResponseSample): string | undefined
}

/** "subject reaches at least minRatio × baseline throughput" (median req/s). */
export interface ThroughputGoal {
  subject: string
  baseline: string
  minRatio: number
}
