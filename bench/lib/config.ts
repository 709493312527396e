/**
 * Run parameters, all from the environment so a quick run is one line:
 *   BENCH_DURATION_SECONDS=2 BENCH_ROUNDS=3 BENCH_WARMUP_SECONDS=1 npm run bench
 */
export interface BenchConfig {
  /** Seconds per measured round, per target. */
  durationSeconds: number
  /** Measured rounds per target; targets are interleaved within each round. */
  rounds: number
  /** Concurrent keep-alive connections autocannon opens. */
  connections: number
  /** Seconds of load per target before the first round; discarded. */
  warmupSeconds: number
  /** Rows in pets.pets. */
  seedPets: number
  /** Target ids to run, in this order (BENCH_TARGETS=a,b); the default suite when empty. */
  targets: string[]
  /** Extra flags for every server child process (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof"). */
  serverNodeArgs: string[]
  /** Keep the server log files instead of deleting them at the end. */
  keepLogs: boolean
  /** Open-loop phase: offered rates as fractions of the baseline's saturation rate; empty skips it. */
  openLoopLoads: number[]
  /** Open-loop rounds per target and load (interleaved like the closed-loop ones). */
  openLoopRounds: number
  /** The target whose median closed-loop req/s is the saturation rate the loads are fractions of. */
  openLoopBaseline: string
  /** `paced` (bench/lib/openLoop.ts, the default) or `autocannon` (its overallRate, for comparison). */
  openLoopTool: 'paced' | 'autocannon'
}

/** The variables `BenchConfig` reads, listed in the report when set. */
export const CONFIG_VARIABLES = [
  'BENCH_DURATION_SECONDS',
  'BENCH_ROUNDS',
  'BENCH_CONNECTIONS',
  'BENCH_WARMUP_SECONDS',
  'BENCH_SEED_PETS',
  'BENCH_TARGETS',
  'BENCH_NODE_ARGS',
  'BENCH_KEEP_LOGS',
  'BENCH_OPEN_LOOP_LOADS',
  'BENCH_OPEN_LOOP_ROUNDS',
  'BENCH_OPEN_LOOP_BASELINE',
  'BENCH_OPEN_LOOP_TOOL',
  'BENCH_REDIS_SERVER',
  'DATABASE_URL',
] as const

function numberFromEnv(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < min) throw new Error(`${name} must be a number ≥ ${min}, got "${raw}"`)
  return value
}

function integerFromEnv(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number): number {
  const value = numberFromEnv(env, name, fallback, min)
  if (!Number.isInteger(value)) throw new Error(`${name} must be an integer, got "${env[name]}"`)
  return value
}

function loadsFromEnv(env: NodeJS.ProcessEnv): number[] {
  const raw = env.BENCH_OPEN_LOOP_LOADS
  if (raw === undefined || raw === '') return [0.5]
  if (raw === 'none' || raw === '0') return []
  return raw.split(',').map((part) => {
    const value = Number(part.trim())
    if (!Number.isFinite(value) || value <= 0 || value > 1.5) {
      throw new Error(`BENCH_OPEN_LOOP_LOADS must be fractions like 0.25,0.5,0.75 (or none), got "${raw}"`)
    }
    return value
  })
}

function toolFromEnv(env: NodeJS.ProcessEnv): BenchConfig['openLoopTool'] {
  const raw = env.BENCH_OPEN_LOOP_TOOL || 'paced'
  if (raw !== 'paced' && raw !== 'autocannon') throw new Error(`BENCH_OPEN_LOOP_TOOL must be paced or autocannon, got "${raw}"`)
  return raw
}

export function loadBenchConfig(env: NodeJS.ProcessEnv = process.env): BenchConfig {
  return {
    durationSeconds: integerFromEnv(env, 'BENCH_DURATION_SECONDS', 5, 1),
    rounds: integerFromEnv(env, 'BENCH_ROUNDS', 5, 1),
    connections: integerFromEnv(env, 'BENCH_CONNECTIONS', 50, 1),
    warmupSeconds: integerFromEnv(env, 'BENCH_WARMUP_SECONDS', 5, 0),
    seedPets: integerFromEnv(env, 'BENCH_SEED_PETS', 1_000, 21),
    targets: [
      ...new Set(
        (env.BENCH_TARGETS ?? '')
          .split(',')
          .map((id) => id.trim())
          .filter(Boolean),
      ),
    ],
    serverNodeArgs: (env.BENCH_NODE_ARGS ?? '').split(/\s+/).filter(Boolean),
    keepLogs: env.BENCH_KEEP_LOGS === '1' || env.BENCH_KEEP_LOGS === 'true',
    openLoopLoads: loadsFromEnv(env),
    openLoopRounds: integerFromEnv(env, 'BENCH_OPEN_LOOP_ROUNDS', 3, 1),
    openLoopBaseline: env.BENCH_OPEN_LOOP_BASELINE || 'http-proxy',
    openLoopTool: toolFromEnv(env),
  }
}
