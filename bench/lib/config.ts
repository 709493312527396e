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
  }
}
