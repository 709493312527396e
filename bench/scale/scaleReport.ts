/**
 * The pure half of the scale phase (bench/scale/scalePhase.ts): parameters, the parsers for what
 * Redis and /proc say, the targets and the markdown section. No I/O here, so it is unit-tested
 * (test/bench/scaleReport.test.ts).
 */

/** Distinct keys driven through the store when BENCH_SCALE_KEYS is not set. */
export const DEFAULT_SCALE_KEYS = 1_000_000

/** The acceptance bar: Redis bytes per active key, and the gateway's RSS whatever the number of keys. */
export const SCALE_TARGETS = {
  maxBytesPerKey: 400,
  maxGatewayRssBytes: 250 * 1024 * 1024,
  /** A second burst of as many new distinct keys may grow RSS by at most this share of the first's RSS. */
  maxRssGrowthShare: 0.1,
} as const

/** The used_memory delta ÷ keys is judged against the byte budget from this many keys on. */
export const DELTA_JUDGED_FROM = 100_000

/** BENCH_SCALE_KEYS: an integer ≥ 0 (underscores allowed, `1_000_000`); 0 skips the phase. */
export function scaleKeysFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.BENCH_SCALE_KEYS
  if (raw === undefined || raw.trim() === '') return DEFAULT_SCALE_KEYS
  const value = Number(raw.trim().replaceAll('_', ''))
  if (!Number.isInteger(value) || value < 0) throw new Error(`BENCH_SCALE_KEYS must be an integer ≥ 0 (0 skips), got "${raw}"`)
  return value
}

/**
 * The key id of the store drive's `index`-th key: `key_` + 12 digits, the length of a real id
 * (`key_` + 12 base64url characters), so the Redis key name `rl:{key_…}` has a real key's size. It
 * is also what redis-benchmark's `__rand_int__` (12 zero-padded digits) expands to, so a
 * redis-benchmark run with `-r keys` lands on keys the drive created.
 */
export function scaleKeyId(index: number): string {
  return `key_${String(index).padStart(12, '0')}`
}

/** `INFO` text as field → value (section headers and blank lines dropped). */
export function parseInfo(text: string): Map<string, string> {
  const fields = new Map<string, string>()
  for (const line of text.split(/\r?\n/)) {
    if (line === '' || line.startsWith('#')) continue
    const colon = line.indexOf(':')
    if (colon > 0) fields.set(line.slice(0, colon), line.slice(colon + 1).trim())
  }
  return fields
}

export function infoNumber(info: Map<string, string>, field: string): number {
  const value = Number(info.get(field))
  if (!Number.isFinite(value)) throw new Error(`INFO has no numeric ${field}`)
  return value
}

/** `INFO keyspace`'s `db0:keys=…,expires=…,avg_ttl=…` line; zeros when db0 is empty. */
export function parseKeyspace(text: string, database = 0): { keys: number; expires: number } {
  const line = parseInfo(text).get(`db${database}`)
  if (line === undefined) return { keys: 0, expires: 0 }
  const keys = Number(/(?:^|,)keys=(\d+)/.exec(line)?.[1])
  const expires = Number(/(?:^|,)expires=(\d+)/.exec(line)?.[1])
  if (!Number.isFinite(keys) || !Number.isFinite(expires)) throw new Error(`cannot read INFO keyspace line "${line}"`)
  return { keys, expires }
}

/** `INFO commandstats` as command → calls and total µs Redis spent executing it (a script's own time, no I/O). */
export function parseCommandTimes(text: string): Map<string, { calls: number; usec: number }> {
  const times = new Map<string, { calls: number; usec: number }>()
  for (const line of text.split(/\r?\n/)) {
    const match = /^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/.exec(line.trim())
    if (match?.[1] && match[2] && match[3]) times.set(match[1].toLowerCase(), { calls: Number(match[2]), usec: Number(match[3]) })
  }
  return times
}

/** VmRSS and VmHWM (peak RSS) from /proc/<pid>/status, in bytes. */
export function parseProcStatusMemory(text: string): { rssBytes: number; peakRssBytes: number } {
  const kib = (name: string) => {
    const match = new RegExp(`^${name}:\\s+(\\d+)\\s+kB`, 'm').exec(text)
    if (!match?.[1]) throw new Error(`/proc status has no ${name}`)
    return Number(match[1]) * 1024
  }
  return { rssBytes: kib('VmRSS'), peakRssBytes: kib('VmHWM') }
}

/** redis-benchmark --csv: the requests per second of its one test line (fields are quoted; the test name may hold commas). */
export function parseRedisBenchmarkCsv(text: string): number {
  for (const line of text.split(/\r?\n/)) {
    const cells = [...line.matchAll(/"((?:[^"]|"")*)"/g)].map((match) => match[1] ?? '')
    if (cells.length >= 2 && cells[0] !== 'test') {
      const value = Number(cells[1])
      if (Number.isFinite(value) && value > 0) return value
    }
  }
  throw new Error(`no requests-per-second line in redis-benchmark output: ${text.slice(0, 200)}`)
}

export interface GatewayGauges {
  /** gateway_key_cache_entries */
  keyCacheEntries?: number
  /** nodejs_heap_size_used_bytes (prom-client's default metrics) */
  heapUsedBytes?: number
  /** gateway_rate_limit_requests_total by source, summed over the other labels */
  decisionsBySource: Record<string, number>
}

/** The few figures the scale phase reads from a gateway's /metrics text. */
export function parseGatewayMetrics(text: string): GatewayGauges {
  const gauges: GatewayGauges = { decisionsBySource: {} }
  for (const line of text.split('\n')) {
    const plain = /^(gateway_key_cache_entries|nodejs_heap_size_used_bytes)(?:\{[^}]*\})? ([0-9.e+-]+)$/.exec(line)
    if (plain?.[1] === 'gateway_key_cache_entries') gauges.keyCacheEntries = Number(plain[2])
    if (plain?.[1] === 'nodejs_heap_size_used_bytes') gauges.heapUsedBytes = Number(plain[2])
    const decision = /^gateway_rate_limit_requests_total\{[^}]*source="([^"]+)"[^}]*\} ([0-9.e+-]+)$/.exec(line)
    if (decision?.[1] && decision[2]) {
      gauges.decisionsBySource[decision[1]] = (gauges.decisionsBySource[decision[1]] ?? 0) + Number(decision[2])
    }
  }
  return gauges
}

/** `count` distinct integers in [0, below), spread evenly with a random offset (no repeats, any size). */
export function spreadSample(count: number, below: number, random: () => number = Math.random): number[] {
  const size = Math.min(count, below)
  if (size <= 0) return []
  const step = below / size
  const offset = random() * step
  const picks = new Set<number>()
  for (let i = 0; i < size; i++) picks.add(Math.min(below - 1, Math.floor(offset + i * step)))
  return [...picks]
}

export interface SampleStats {
  count: number
  mean: number
  min: number
  max: number
}

export function sampleStats(values: number[]): SampleStats {
  if (values.length === 0) return { count: 0, mean: Number.NaN, min: Number.NaN, max: Number.NaN }
  let sum = 0
  let min = Infinity
  let max = -Infinity
  for (const value of values) {
    sum += value
    if (value < min) min = value
    if (value > max) max = value
  }
  return { count: values.length, mean: sum / values.length, min, max }
}

export interface StoreDrive {
  keys: number
  /** Decisions in flight at once. */
  inFlight: number
  seconds: number
  decisionsPerSecond: number
  outcomes: Record<string, number>
  errors: number
  /** Redis's own CPU (user + system, /proc) ÷ decisions. */
  redisCpuMicrosPerDecision?: number
  /** Redis's CPU as a share of one core during the drive. */
  redisCpuPercent?: number
  /** Time Redis spent executing the script per EVALSHA/EVAL (INFO commandstats usec, no network I/O). */
  scriptMicrosPerCall?: number
  /** This process's CPU (ioredis and the harness) ÷ decisions. */
  clientCpuMicrosPerDecision: number
  /** INFO commandstats deltas: what the store sent (evalsha, eval on NOSCRIPT) and what its script ran. */
  commands: Record<string, number>
}

export interface RedisMemory {
  usedBytesBefore: number
  usedBytesAfter: number
  /** (used_memory after − before) ÷ keys driven. */
  bytesPerKeyDelta: number
  rssBytesAfter: number
  /** MEMORY USAGE over a sample of the driven keys. */
  memoryUsage: SampleStats
  /** Length of one key's value (STRLEN), from the sample. */
  valueBytes: number
  dbsize: number
  keyspace: { keys: number; expires: number }
  ttl: {
    sampled: number
    /** Sampled keys with a positive PTTL. */
    withTtl: number
    /** Sampled keys that do not exist (PTTL −2). */
    missing: number
    /** Sampled keys without an expiry (PTTL −1). */
    persistent: number
    minMillis: number
    maxMillis: number
  }
}

export interface RedisBenchmarkRun {
  command: string
  requests: number
  clients: number
  pipeline: number
  requestsPerSecond: number
  redisCpuMicrosPerCall?: number
  redisCpuPercent?: number
  /** Time inside the script per call (INFO commandstats usec). */
  scriptMicrosPerCall?: number
  errorReplies: number
}

export interface HttpStep {
  name: string
  /** New distinct keys sent in this step (each once). */
  distinctKeys: number
  seconds: number
  requestsPerSecond: number
  statuses: Record<string, number>
  errors: number
  rssBytes: number
  peakRssBytes: number
  /** gateway_key_cache_entries from the gateway's /metrics after the step. */
  keyCacheEntries?: number
  /** V8 heap in use after the step (nodejs_heap_size_used_bytes). */
  heapUsedBytes?: number
  /** The gateway's CPU (user + system, /proc) ÷ requests: a request whose key is not in the key cache (one Postgres lookup). */
  gatewayCpuMicrosPerRequest?: number
  /** V8 heap in use after a full garbage collection (forced through the inspector): live data. */
  liveHeapBytes?: number
  /** RSS after that collection. */
  rssAfterGcBytes?: number
  /** Decisions of this step the per-process fallback made (Redis missed its budget or failed). */
  fallbackDecisions?: number
}

export interface HttpScale {
  gatewayPid: number
  keyCacheMaxEntries: number
  keysInserted: number
  insertSeconds: number
  connections: number
  steps: HttpStep[]
}

export interface ScaleTarget {
  label: string
  met: boolean
  measured: string
}

export interface ScaleReport {
  startedAt: string
  keys: number
  plan: string
  windows: string
  store: StoreDrive
  memory: RedisMemory
  redisBenchmark?: RedisBenchmarkRun
  redisBenchmarkSkipped?: string
  http?: HttpScale
  targets: ScaleTarget[]
  /** Anything that makes the phase's numbers invalid (errors, unexpected statuses, keys without TTL). */
  problems: string[]
  /** Machine load average (1 min) at the start and the end of the phase. */
  loadAverage: { start: number; end: number }
}

const count = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })
const one = new Intl.NumberFormat('en-US', { maximumFractionDigits: 1 })
const megabytes = (bytes: number) => `${one.format(bytes / (1024 * 1024))} MB`
const heapText = (bytes: number | undefined) => (bytes === undefined ? 'n/a' : megabytes(bytes))

/** The acceptance bar as met / MISSED lines, from the measured numbers. */
export function evaluateScaleTargets(report: Pick<ScaleReport, 'keys' | 'memory' | 'http'>): ScaleTarget[] {
  const { memory, http } = report
  const targets: ScaleTarget[] = []
  // The used_memory delta also carries Redis's fixed costs (script cache, client buffers, hash-table
  // steps), which only vanish per key over many keys: below DELTA_JUDGED_FROM keys only MEMORY USAGE counts.
  const judgeDelta = report.keys >= DELTA_JUDGED_FROM
  const perKey = judgeDelta ? Math.max(memory.bytesPerKeyDelta, memory.memoryUsage.max) : memory.memoryUsage.max
  targets.push({
    label: `Redis ≤ ${SCALE_TARGETS.maxBytesPerKey} bytes per active key`,
    met: Number.isFinite(perKey) && perKey <= SCALE_TARGETS.maxBytesPerKey,
    measured:
      `${one.format(memory.bytesPerKeyDelta)} bytes (used_memory delta ÷ ${count.format(report.keys)} keys` +
      `${judgeDelta ? '' : `; not judged below ${count.format(DELTA_JUDGED_FROM)} keys, where fixed costs weigh per key`}), ` +
      `${one.format(memory.memoryUsage.mean)} bytes (MEMORY USAGE, mean of ${count.format(memory.memoryUsage.count)}, max ${count.format(memory.memoryUsage.max)})`,
  })
  const everyTtl =
    memory.keyspace.keys >= report.keys &&
    memory.keyspace.expires === memory.keyspace.keys &&
    memory.ttl.sampled > 0 &&
    memory.ttl.withTtl === memory.ttl.sampled
  targets.push({
    label: 'every rate-limit key has a TTL',
    met: everyTtl,
    measured:
      `${count.format(memory.keyspace.expires)} of ${count.format(memory.keyspace.keys)} keys with an expiry (INFO keyspace); ` +
      `sample: ${count.format(memory.ttl.withTtl)} of ${count.format(memory.ttl.sampled)} with a PTTL > 0` +
      (memory.ttl.missing > 0 ? `, ${count.format(memory.ttl.missing)} missing` : '') +
      (memory.ttl.persistent > 0 ? `, ${count.format(memory.ttl.persistent)} without expiry` : ''),
  })
  if (http && http.steps.length > 0) {
    const afterKeys = http.steps.filter((step) => step.distinctKeys > 0)
    const worst = Math.max(...afterKeys.map((step) => step.rssBytes))
    targets.push({
      label: `gateway RSS ≤ ${megabytes(SCALE_TARGETS.maxGatewayRssBytes)}`,
      met: worst <= SCALE_TARGETS.maxGatewayRssBytes,
      measured: afterKeys.map((step) => `${megabytes(step.rssBytes)} after ${step.name}`).join(', '),
    })
    // Bounded: once the cache is full, one more burst of as many new keys must not grow what the
    // process keeps (the live heap after a full GC; RSS when that could not be read).
    const bursts = http.steps.filter((step) => step.distinctKeys > http.keyCacheMaxEntries)
    const [previous, last] = [bursts.at(-2), bursts.at(-1)]
    if (previous && last) {
      const live = previous.liveHeapBytes !== undefined && last.liveHeapBytes !== undefined
      const [from, to] = live ? [previous.liveHeapBytes as number, last.liveHeapBytes as number] : [previous.rssBytes, last.rssBytes]
      const growth = to - from
      const share = Math.round(SCALE_TARGETS.maxRssGrowthShare * 100)
      targets.push({
        label:
          `gateway memory bounded by the key cache: one more burst of ${count.format(last.distinctKeys)} new keys ` +
          `(cache already full) grows the ${live ? 'live heap (after a full GC)' : 'RSS'} ≤ ${share} %`,
        met: growth <= from * SCALE_TARGETS.maxRssGrowthShare,
        measured:
          `${live ? 'live heap' : 'RSS'} ${growth >= 0 ? '+' : '−'}${megabytes(Math.abs(growth))} (${megabytes(from)} → ${megabytes(to)}); ` +
          `RSS ${megabytes(previous.rssBytes)} → ${megabytes(last.rssBytes)}, after a full GC ${heapText(previous.rssAfterGcBytes)} → ${heapText(last.rssAfterGcBytes)}; ` +
          `key cache ${count.format(last.keyCacheEntries ?? Number.NaN)} of ${count.format(http.keyCacheMaxEntries)} entries`,
      })
    }
  }
  return targets
}

function statusText(statuses: Record<string, number>): string {
  return Object.entries(statuses)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([status, n]) => `${status} × ${count.format(n)}`)
    .join(', ') || 'none'
}

/** The report's "Scale of keys" section (markdown), appended to bench/results/latest.md. */
export function renderScaleSection(report: ScaleReport): string {
  const { store, memory, http } = report
  const lines: string[] = []
  lines.push('## Scale of keys')
  lines.push('')
  lines.push(
    `${count.format(report.keys)} distinct keys through \`createRedisStore(...).consume\` (the gateway's store, one EVALSHA each, ` +
      `${count.format(store.inFlight)} in flight) on a private redis-server, plan \`${report.plan}\`, windows ${report.windows}; ` +
      'then real API keys through a real gateway process. ' +
      `Machine load average ${report.loadAverage.start} at the start of the phase, ${report.loadAverage.end} at the end: this 2-core machine is shared, so rates and CPU figures move with other work; bytes per key do not.`,
  )
  lines.push('')
  lines.push('| Store drive | value |')
  lines.push('| --- | ---: |')
  lines.push(`| decisions | ${count.format(store.keys)} in ${one.format(store.seconds)} s (${count.format(store.decisionsPerSecond)}/s) |`)
  lines.push(`| outcomes | ${statusText(store.outcomes)}; errors ${count.format(store.errors)} |`)
  lines.push(
    `| Redis CPU per decision | ${store.redisCpuMicrosPerDecision === undefined ? 'n/a' : `${one.format(store.redisCpuMicrosPerDecision)} µs (Redis at ${count.format(store.redisCpuPercent ?? Number.NaN)} % of a core)`} |`,
  )
  lines.push(`| Redis time inside the script per call (INFO commandstats usec) | ${store.scriptMicrosPerCall === undefined ? 'n/a' : `${one.format(store.scriptMicrosPerCall)} µs`} |`)
  lines.push(`| client CPU per decision (ioredis + harness) | ${one.format(store.clientCpuMicrosPerDecision)} µs |`)
  lines.push(`| commands (INFO commandstats) | ${Object.entries(store.commands).map(([name, n]) => `${name.toUpperCase()} ${count.format(n)}`).join(', ') || 'none'} |`)
  if (report.redisBenchmark) {
    const run = report.redisBenchmark
    lines.push(
      `| one Redis core's EVALSHA rate (redis-benchmark, ${run.clients} clients, pipeline ${run.pipeline}, ${count.format(run.requests)} calls on the driven keys) | ` +
        `${count.format(run.requestsPerSecond)}/s, Redis CPU ${run.redisCpuMicrosPerCall === undefined ? 'n/a' : `${one.format(run.redisCpuMicrosPerCall)} µs/call at ${count.format(run.redisCpuPercent ?? Number.NaN)} % of a core`}` +
        `${run.scriptMicrosPerCall === undefined ? '' : `, ${one.format(run.scriptMicrosPerCall)} µs inside the script`}; error replies ${count.format(run.errorReplies)} |`,
    )
  } else if (report.redisBenchmarkSkipped) {
    lines.push(`| one Redis core's EVALSHA rate (redis-benchmark) | skipped: ${report.redisBenchmarkSkipped} |`)
  }
  lines.push('')
  lines.push('| Redis memory | value |')
  lines.push('| --- | ---: |')
  lines.push(`| used_memory before → after | ${megabytes(memory.usedBytesBefore)} → ${megabytes(memory.usedBytesAfter)} (RSS ${megabytes(memory.rssBytesAfter)}) |`)
  lines.push(`| bytes per key, used_memory delta ÷ keys | ${one.format(memory.bytesPerKeyDelta)} |`)
  lines.push(
    `| bytes per key, MEMORY USAGE (sample of ${count.format(memory.memoryUsage.count)}) | mean ${one.format(memory.memoryUsage.mean)}, min ${count.format(memory.memoryUsage.min)}, max ${count.format(memory.memoryUsage.max)} |`,
  )
  lines.push(`| value length (STRLEN) | ${count.format(memory.valueBytes)} bytes |`)
  lines.push(`| keys (DBSIZE) / with an expiry (INFO keyspace) | ${count.format(memory.dbsize)} / ${count.format(memory.keyspace.expires)} |`)
  lines.push(
    `| PTTL over the sample | ${count.format(memory.ttl.withTtl)} of ${count.format(memory.ttl.sampled)} > 0, ${one.format(memory.ttl.minMillis / 3_600_000)}–${one.format(memory.ttl.maxMillis / 3_600_000)} h |`,
  )
  if (http) {
    lines.push('')
    lines.push(
      `Through HTTP: ${count.format(http.keysInserted)} real keys (\`aas_…\`, SHA-256 stored) inserted into the bench database in ${one.format(http.insertSeconds)} s, ` +
        `then a gateway process of its own (\`gateway/src/main.ts\`, key cache of ${count.format(http.keyCacheMaxEntries)} entries) sent \`GET /v1/pets?limit=20\` ` +
        `once per key over ${http.connections} connections. RSS and peak RSS from /proc/<pid>/status as they were; then a full GC (forced through the gateway's inspector) and the live heap and RSS after it.`,
    )
    lines.push('')
    lines.push('| Gateway step | new distinct keys | req/s | gateway CPU µs/req | statuses | errors | fallback decisions | RSS | peak RSS | V8 heap in use | after a full GC: heap / RSS | key cache entries |')
    lines.push('| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
    for (const step of http.steps) {
      lines.push(
        `| ${step.name} | ${count.format(step.distinctKeys)} | ${step.distinctKeys === 0 ? '' : count.format(step.requestsPerSecond)} | ` +
          `${step.gatewayCpuMicrosPerRequest === undefined ? '' : count.format(step.gatewayCpuMicrosPerRequest)} | ${step.distinctKeys === 0 ? '' : statusText(step.statuses)} | ${count.format(step.errors)} | ` +
          `${step.fallbackDecisions === undefined ? 'n/a' : count.format(step.fallbackDecisions)} | ` +
          `${megabytes(step.rssBytes)} | ${megabytes(step.peakRssBytes)} | ${heapText(step.heapUsedBytes)} | ${heapText(step.liveHeapBytes)} / ${heapText(step.rssAfterGcBytes)} | ${step.keyCacheEntries === undefined ? 'n/a' : count.format(step.keyCacheEntries)} |`,
      )
    }
  }
  lines.push('')
  lines.push('### Scale targets')
  lines.push('')
  for (const target of report.targets) lines.push(`- ${target.label}: ${target.met ? 'met' : '**MISSED**'} (${target.measured})`)
  if (report.problems.length > 0) {
    lines.push('')
    lines.push('### Scale problems')
    lines.push('')
    for (const problem of report.problems) lines.push(`- ${problem}`)
  }
  return `${lines.join('\n')}\n`
}
