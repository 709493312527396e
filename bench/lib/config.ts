/**
 * Run parameters, all from the environment so a quick run is one line:
 *   BENCH_DURATION_SECONDS=2 BENCH_ROUNDS=3 BENCH_WARMUP_SECONDS=1 npm run bench
 */
export interface BenchConfig {
  /** Seconds per measured round, per target. */
  durationSeconds: number
  /** Measured rounds per target; targets are interleaved within each round. */
  rounds: number
  /**
   * The closed-loop level the table's main columns, the targets (GOALS) and the open-loop pool use:
   * BENCH_GOAL_CONNECTIONS, else 100 when swept, else the largest level.
   */
  connections: number
  /** Closed-loop levels (concurrent keep-alive connections, pipelining 1), ascending: BENCH_CONNECTIONS=1,10,100. */
  connectionLevels: number[]
  /** Rounds at every level but `connections` (which gets `rounds`). */
  sweepRounds: number
  /** Seconds per round at every level but `connections` (which gets `durationSeconds`). */
  sweepDurationSeconds: number
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
  'BENCH_GOAL_CONNECTIONS',
  'BENCH_SWEEP_ROUNDS',
  'BENCH_SWEEP_DURATION_SECONDS',
  'BENCH_NGINX',
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

/** The default closed-loop sweep and the level the targets read. */
export const DEFAULT_CONNECTION_LEVELS = [1, 10, 100]
export const DEFAULT_GOAL_CONNECTIONS = 100
export const DEFAULT_OPEN_LOOP_LOADS = [0.25, 0.5, 0.75]

function connectionLevelsFromEnv(env: NodeJS.ProcessEnv): number[] {
  const raw = env.BENCH_CONNECTIONS
  if (raw === undefined || raw.trim() === '') return DEFAULT_CONNECTION_LEVELS
  const levels = raw.split(',').map((part) => {
    const value = Number(part.trim())
    if (!Number.isInteger(value) || value < 1) {
      throw new Error(`BENCH_CONNECTIONS must be positive integers like 1,10,100 (or one number), got "${raw}"`)
    }
    return value
  })
  return [...new Set(levels)].sort((a, b) => a - b)
}

function goalConnectionsFromEnv(env: NodeJS.ProcessEnv, levels: number[]): number {
  const raw = env.BENCH_GOAL_CONNECTIONS
  if (raw === undefined || raw === '') {
    return levels.includes(DEFAULT_GOAL_CONNECTIONS) ? DEFAULT_GOAL_CONNECTIONS : (levels.at(-1) as number)
  }
  const value = Number(raw)
  if (!levels.includes(value)) throw new Error(`BENCH_GOAL_CONNECTIONS must be one of BENCH_CONNECTIONS (${levels.join(',')}), got "${raw}"`)
  return value
}

function loadsFromEnv(env: NodeJS.ProcessEnv): number[] {
  const raw = env.BENCH_OPEN_LOOP_LOADS
  if (raw === undefined || raw === '') return DEFAULT_OPEN_LOOP_LOADS
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
  const connectionLevels = connectionLevelsFromEnv(env)
  const durationSeconds = integerFromEnv(env, 'BENCH_DURATION_SECONDS', 5, 1)
  const rounds = integerFromEnv(env, 'BENCH_ROUNDS', 5, 1)
  return {
    durationSeconds,
    rounds,
    connections: goalConnectionsFromEnv(env, connectionLevels),
    connectionLevels,
    // Never more than the goal level's: a quick run (BENCH_ROUNDS=2) stays quick at every level.
    sweepRounds: integerFromEnv(env, 'BENCH_SWEEP_ROUNDS', Math.min(3, rounds), 1),
    sweepDurationSeconds: integerFromEnv(env, 'BENCH_SWEEP_DURATION_SECONDS', Math.min(2, durationSeconds), 1),
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
    // Three loads × every open-loop row: two rounds each keeps a full run near 15 minutes.
    openLoopRounds: integerFromEnv(env, 'BENCH_OPEN_LOOP_ROUNDS', 2, 1),
    openLoopBaseline: env.BENCH_OPEN_LOOP_BASELINE || 'http-proxy',
    openLoopTool: toolFromEnv(env),
  }
}
