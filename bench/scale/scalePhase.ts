/**
 * The scale phase of `npm run bench` (and `npm run bench:scale` alone): how the limiter behaves
 * with many distinct keys.
 *
 * 1. Store drive: BENCH_SCALE_KEYS distinct key ids (default 1,000,000) through the gateway's own
 *    `createRedisStore(connectRedis(...)).consume`, many in flight, on a private redis-server of
 *    its own (never the shared 6379). Then Redis bytes per key (used_memory delta ÷ keys, and
 *    MEMORY USAGE over a random sample), that every key has a TTL (INFO keyspace's expires count,
 *    PTTL over the sample), and one Redis core's EVALSHA rate (redis-benchmark, pipelined, on the
 *    keys the drive created).
 * 2. HTTP: real keys (the format of gateway/src/keys/apiKeyFormat.ts, SHA-256 stored) inserted in
 *    bulk into the bench database, then a gateway process of its own sends one request per key:
 *    a sample smaller than the key cache, then two bursts of new keys twice the key cache each.
 *    The gateway's RSS (/proc/<pid>/status) after each step shows whether memory follows the
 *    number of keys or stays bounded by the cache.
 */
import { execFile } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Redis } from 'ioredis'
import { parse, stringify } from 'yaml'
import { Pool, WebSocket } from 'undici'
import { createPool } from '../../common/src/database/pool.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { DEFAULT_CONFIG_PATH, parseGatewayConfig, resolveGatewayConfig, type GatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import { displayPrefix, generateApiKey, hashApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { banPolicy, limitsFor } from '../../gateway/src/rateLimit/planLimits.ts'
import type { LimitRequest } from '../../gateway/src/rateLimit/limitStore.ts'
import { limitKey } from '../../gateway/src/rateLimit/limitStore.ts'
import { connectRedis, createRedisStore, redisReady } from '../../gateway/src/rateLimit/redisStore.ts'
import { SLIDING_WINDOW_LUA } from '../../gateway/src/rateLimit/slidingWindowScript.ts'
import { REPO_ROOT, freePort, startChildServer, type ChildServer } from '../lib/childServer.ts'
import { processCpuSeconds } from '../lib/processCpu.ts'
import { startPrivateRedis, type PrivateRedis } from '../lib/redisServer.ts'
import { gatewayEnv } from '../targets/gateway.ts'
import { PROXY_PATH } from '../targets/proxyRows.ts'
import { staticUpstream } from '../targets/shared.ts'
import type { TargetContext } from '../targets/types.ts'
import {
  evaluateScaleTargets,
  infoNumber,
  scaleKeysFromEnv,
  parseInfo,
  parseCommandTimes,
  parseGatewayMetrics,
  parseKeyspace,
  parseProcStatusMemory,
  parseRedisBenchmarkCsv,
  sampleStats,
  scaleKeyId,
  spreadSample,
  type GatewayGauges,
  type HttpScale,
  type HttpStep,
  type RedisBenchmarkRun,
  type RedisMemory,
  type ScaleReport,
  type StoreDrive,
} from './scaleReport.ts'

export { renderScaleSection, scaleKeysFromEnv, type ScaleReport } from './scaleReport.ts'

export interface ScaleContext extends TargetContext {
  /** Distinct keys through the store (BENCH_SCALE_KEYS). */
  keys: number
  progress(message: string): void
  /** Throws when the run was interrupted (Ctrl-C); called between steps and during long loops. */
  checkInterrupted?(): void
  /** Store decisions in flight at once (default 256). */
  inFlight?: number
  /** Keys in the HTTP sample, fewer than the key cache holds (default 2,000, at most half the cache). */
  httpSampleKeys?: number
  /** The gateway's key cache size (default: config/gateway.yaml's keyCache.maxEntries). */
  keyCacheMaxEntries?: number
  /** Skip the HTTP part (store only). */
  skipHttp?: boolean
  /** Skip redis-benchmark even when it is installed. */
  skipRedisBenchmark?: boolean
}

/** The plan every scale key has: the shipped config's free plan (the commonest key). */
const SCALE_PLAN = 'free'
const MEMORY_SAMPLE = 2_000
const HTTP_CONNECTIONS = 32
const INSERT_CHUNK = 5_000
/** Bursts of new distinct keys after the sample, each this many times the key cache. */
const BURSTS = 3
const BURST_OF_CACHE = 1.2

const delay = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))
const round1 = (value: number) => Math.round(value * 10) / 10

function shippedConfig(): { text: string; config: GatewayConfig } {
  const text = readFileSync(path.join(REPO_ROOT, DEFAULT_CONFIG_PATH), 'utf8')
  return { text, config: resolveGatewayConfig(parseGatewayConfig(text, DEFAULT_CONFIG_PATH), {}) }
}

function describeWindows(config: GatewayConfig): string {
  const { minute, day } = config.windows
  const span = (millis: number) => (millis >= 3_600_000 ? `${millis / 3_600_000} h` : `${millis / 1_000} s`)
  return `${span(minute.lengthMillis)} in ${span(minute.bucketMillis)} buckets, ${span(day.lengthMillis)} in ${span(day.bucketMillis)} buckets`
}

function limitRequest(config: GatewayConfig, keyId: string): LimitRequest {
  return { keyId, ...limitsFor({ plan: SCALE_PLAN, perMinute: null, perDay: null }, config), bans: banPolicy(config) }
}

/** Runs `work(index)` for index 0…count−1 with `concurrency` of them in flight. */
async function inParallel(count: number, concurrency: number, work: (index: number) => Promise<void>, onProgress?: (done: number) => void, checkInterrupted?: () => void): Promise<void> {
  let next = 0
  let done = 0
  const step = Math.max(1, Math.floor(count / 10))
  const worker = async () => {
    for (;;) {
      const index = next++
      if (index >= count) return
      await work(index)
      done++
      if (done % step === 0) {
        onProgress?.(done)
        checkInterrupted?.()
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker))
}

async function driveStore(context: ScaleContext, redis: PrivateRedis, probe: Redis, config: GatewayConfig): Promise<StoreDrive> {
  const inFlight = context.inFlight ?? 256
  const client = connectRedis({ url: redis.url, commandTimeoutMillis: 2_000 })
  const store = createRedisStore(client)
  try {
    if (!(await redisReady(client, 5_000))) throw new Error(`the scale phase's Redis at ${redis.url} is not ready`)
    const template = limitRequest(config, scaleKeyId(0))
    const outcomes: Record<string, number> = {}
    let errors = 0
    let firstError: string | undefined
    const commandsBefore = await redis.commandCalls()
    const timesBefore = parseCommandTimes(await probe.info('commandstats'))
    const redisBefore = processCpuSeconds(redis.pid)
    const clientBefore = process.cpuUsage()
    const started = performance.now()
    await inParallel(
      context.keys,
      inFlight,
      async (index) => {
        try {
          const decision = await store.consume({ ...template, keyId: scaleKeyId(index) })
          outcomes[decision.outcome] = (outcomes[decision.outcome] ?? 0) + 1
        } catch (error) {
          errors++
          firstError ??= error instanceof Error ? error.message : String(error)
        }
      },
      (done) => context.progress(`scale: ${done.toLocaleString('en-US')} of ${context.keys.toLocaleString('en-US')} keys through the store`),
      context.checkInterrupted,
    )
    const seconds = (performance.now() - started) / 1_000
    const client_ = process.cpuUsage(clientBefore)
    const redisAfter = processCpuSeconds(redis.pid)
    const commandsAfter = await redis.commandCalls()
    const timesAfter = parseCommandTimes(await probe.info('commandstats'))
    const commands: Record<string, number> = {}
    for (const [name, calls] of commandsAfter) {
      const delta = calls - (commandsBefore.get(name) ?? 0)
      if (name !== 'info' && delta > 0) commands[name] = delta
    }
    let [scriptCalls, scriptUsec] = [0, 0]
    for (const name of ['evalsha', 'eval']) {
      scriptCalls += (timesAfter.get(name)?.calls ?? 0) - (timesBefore.get(name)?.calls ?? 0)
      scriptUsec += (timesAfter.get(name)?.usec ?? 0) - (timesBefore.get(name)?.usec ?? 0)
    }
    const redisCpu = redisBefore === undefined || redisAfter === undefined ? undefined : redisAfter - redisBefore
    if (firstError !== undefined) context.progress(`scale: ${errors} store errors, the first: ${firstError}`)
    return {
      keys: context.keys,
      inFlight,
      seconds,
      decisionsPerSecond: context.keys / seconds,
      outcomes,
      errors,
      ...(redisCpu === undefined
        ? {}
        : { redisCpuMicrosPerDecision: (redisCpu * 1e6) / context.keys, redisCpuPercent: (redisCpu / seconds) * 100 }),
      ...(scriptCalls > 0 ? { scriptMicrosPerCall: scriptUsec / scriptCalls } : {}),
      clientCpuMicrosPerDecision: (client_.user + client_.system) / context.keys,
      commands,
    }
  } finally {
    await store.close()
  }
}

async function measureMemory(probe: Redis, keys: number, usedBytesBefore: number): Promise<RedisMemory> {
  const memoryInfo = parseInfo(await probe.info('memory'))
  const usedBytesAfter = infoNumber(memoryInfo, 'used_memory')
  const sample = spreadSample(MEMORY_SAMPLE, keys)
  const pipeline = probe.pipeline()
  for (const index of sample) {
    const key = limitKey(scaleKeyId(index))
    pipeline.call('MEMORY', 'USAGE', key)
    pipeline.pttl(key)
    pipeline.strlen(key)
  }
  const replies = (await pipeline.exec()) ?? []
  const usages: number[] = []
  const ttls: number[] = []
  let missing = 0
  let persistent = 0
  let valueBytes = 0
  for (let i = 0; i < sample.length; i++) {
    const [usage, ttl, length] = [replies[3 * i]?.[1], replies[3 * i + 1]?.[1], replies[3 * i + 2]?.[1]]
    if (typeof usage === 'number') usages.push(usage)
    if (ttl === -2) missing++
    else if (ttl === -1) persistent++
    else if (typeof ttl === 'number' && ttl > 0) ttls.push(ttl)
    if (typeof length === 'number' && length > valueBytes) valueBytes = length
  }
  return {
    usedBytesBefore,
    usedBytesAfter,
    bytesPerKeyDelta: keys === 0 ? Number.NaN : (usedBytesAfter - usedBytesBefore) / keys,
    rssBytesAfter: infoNumber(memoryInfo, 'used_memory_rss'),
    memoryUsage: sampleStats(usages),
    valueBytes,
    dbsize: await probe.dbsize(),
    keyspace: parseKeyspace(await probe.info('keyspace')),
    ttl: {
      sampled: sample.length,
      withTtl: ttls.length,
      missing,
      persistent,
      minMillis: ttls.length === 0 ? Number.NaN : Math.min(...ttls),
      maxMillis: ttls.length === 0 ? Number.NaN : Math.max(...ttls),
    },
  }
}

function run(binary: string, args: string[], timeoutMillis: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(binary, args, { timeout: timeoutMillis, maxBuffer: 1 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${binary} failed: ${error.message} ${stderr.slice(0, 300)}`))
      else resolve(stdout)
    })
  })
}

/**
 * One Redis core's EVALSHA rate: redis-benchmark (C, pipelined, so the client is not the limit)
 * sends the gateway's script with the shipped free plan's arguments to keys the drive created
 * (`__rand_int__` is 12 zero-padded digits, the scale key id's number). The argument order is
 * the one redisStore.ts's consume() sends; an error reply from Redis (a changed order) voids the
 * figure.
 */
async function redisBenchmark(context: ScaleContext, redis: PrivateRedis, probe: Redis, config: GatewayConfig): Promise<RedisBenchmarkRun | string> {
  if (context.skipRedisBenchmark) return 'not asked for'
  const binary = process.env.BENCH_REDIS_BENCHMARK || 'redis-benchmark'
  const sha = createHash('sha1').update(SLIDING_WINDOW_LUA).digest('hex')
  const loaded = await probe.script('LOAD', SLIDING_WINDOW_LUA)
  if (loaded !== sha) return `SCRIPT LOAD answered ${String(loaded)}, expected ${sha}`
  const { minute, day, bans } = limitRequest(config, 'x')
  const scriptArgs = [
    '0', minute.limit, minute.windowMillis, minute.bucketMillis, day.limit, day.windowMillis, day.bucketMillis,
    bans.strikes, bans.memoryMillis, bans.ladderMillis.join(','),
  ].map(String)
  const requests = Math.max(100_000, Math.min(300_000, context.keys))
  const [clients, pipeline] = [50, 16]
  const { port } = new URL(redis.url)
  const args = [
    '-h', '127.0.0.1', '-p', port, '-c', String(clients), '-n', String(requests), '-P', String(pipeline),
    '-r', String(Math.max(1, context.keys)), '--csv',
    'EVALSHA', sha, '1', limitKey('key___rand_int__'), ...scriptArgs,
  ]
  const errorsBefore = infoNumber(parseInfo(await probe.info('stats')), 'total_error_replies')
  const timesBefore = parseCommandTimes(await probe.info('commandstats')).get('evalsha')
  const cpuBefore = processCpuSeconds(redis.pid)
  const started = performance.now()
  let output: string
  try {
    output = await run(binary, args, 120_000)
  } catch (error) {
    return error instanceof Error ? error.message : String(error)
  }
  const seconds = (performance.now() - started) / 1_000
  const cpuAfter = processCpuSeconds(redis.pid)
  const errorReplies = infoNumber(parseInfo(await probe.info('stats')), 'total_error_replies') - errorsBefore
  const timesAfter = parseCommandTimes(await probe.info('commandstats')).get('evalsha')
  const scriptCalls = (timesAfter?.calls ?? 0) - (timesBefore?.calls ?? 0)
  const cpu = cpuBefore === undefined || cpuAfter === undefined ? undefined : cpuAfter - cpuBefore
  return {
    command: `redis-benchmark ${args.slice(4).join(' ').replace(sha, '<sha>').replace(scriptArgs.join(' '), '<free plan arguments>')}`,
    requests,
    clients,
    pipeline,
    requestsPerSecond: parseRedisBenchmarkCsv(output),
    ...(cpu === undefined ? {} : { redisCpuMicrosPerCall: (cpu * 1e6) / requests, redisCpuPercent: (cpu / seconds) * 100 }),
    ...(scriptCalls > 0 ? { scriptMicrosPerCall: ((timesAfter?.usec ?? 0) - (timesBefore?.usec ?? 0)) / scriptCalls } : {}),
    errorReplies,
  }
}

/** Real keys, inserted in bulk the way keyRepository.create() stores one (no change-log rows: none is a change). */
async function insertKeys(databaseUrl: string, count: number): Promise<string[]> {
  const pool = createPool({ connectionString: databaseUrl, applicationName: 'bench-scale-keys', max: 1 })
  try {
    await migrate(pool, GATEWAY_MIGRATIONS)
    const keys = Array.from({ length: count }, () => generateApiKey())
    const client = await pool.connect()
    try {
      await client.query('BEGIN')
      // The insert trigger writes a change-log row and a NOTIFY per key, which any gateway already
      // following this database would replay; a new key is not a change, so skip it when allowed
      // (superuser, as on the local server) and accept it otherwise.
      await client.query('SAVEPOINT replica')
      try {
        await client.query("SET LOCAL session_replication_role = 'replica'")
      } catch {
        await client.query('ROLLBACK TO SAVEPOINT replica')
      }
      for (let start = 0; start < count; start += INSERT_CHUNK) {
        const chunk = keys.slice(start, start + INSERT_CHUNK)
        await client.query(
          `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan)
           SELECT id, hash, prefix, 'bench: scale', $4 FROM unnest($1::text[], $2::bytea[], $3::text[]) AS k(id, hash, prefix)`,
          [
            chunk.map((_, i) => `key_s${String(start + i).padStart(7, '0')}${randomBytes(3).toString('hex').slice(0, 4)}`),
            chunk.map((key) => hashApiKey(key)),
            chunk.map((key) => displayPrefix(key)),
            SCALE_PLAN,
          ],
        )
      }
      await client.query('COMMIT')
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined)
      throw error
    } finally {
      client.release()
    }
    return keys
  } finally {
    await pool.end()
  }
}

function gatewayMemory(pid: number): { rssBytes: number; peakRssBytes: number } {
  return parseProcStatusMemory(readFileSync(`/proc/${pid}/status`, 'utf8'))
}

async function gatewayGauges(opsOrigin: string): Promise<GatewayGauges | undefined> {
  try {
    return parseGatewayMetrics(await (await fetch(`${opsOrigin}/metrics`, { signal: AbortSignal.timeout(5_000) })).text())
  } catch {
    return undefined
  }
}

interface ScaleGateway {
  server: ChildServer
  origin: string
  opsOrigin: string
  /** The gateway's inspector (loopback only), used to run a full garbage collection before reading the live heap. */
  inspectOrigin: string
}

/**
 * Runs a full garbage collection in the gateway (Chrome DevTools Protocol, HeapProfiler.collectGarbage
 * over the inspector's WebSocket), so the heap read next is live data, not garbage V8 has not
 * collected yet. False when the inspector did not answer.
 */
async function collectGarbage(inspectOrigin: string): Promise<boolean> {
  try {
    const targets = (await (await fetch(`${inspectOrigin}/json/list`, { signal: AbortSignal.timeout(5_000) })).json()) as Array<{ webSocketDebuggerUrl?: string }>
    const url = targets[0]?.webSocketDebuggerUrl
    if (!url) return false
    const socket = new WebSocket(url)
    return await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => finish(false), 30_000)
      const finish = (done: boolean) => {
        clearTimeout(timer)
        socket.close()
        resolve(done)
      }
      socket.addEventListener('open', () => socket.send(JSON.stringify({ id: 1, method: 'HeapProfiler.collectGarbage' })))
      socket.addEventListener('message', (event) => {
        const reply = JSON.parse(String(event.data)) as { id?: number; error?: unknown }
        if (reply.id === 1) finish(reply.error === undefined)
      })
      socket.addEventListener('error', () => finish(false))
    })
  } catch {
    return false
  }
}

async function startScaleGateway(context: ScaleContext, redisUrl: string, keyCacheMaxEntries: number): Promise<ScaleGateway> {
  const upstream = await staticUpstream(context)
  const [port, opsPort, inspectPort] = [await freePort(), await freePort(), await freePort()]
  // The shipped config with every free-plan key admitted for its one request; the key cache as shipped unless asked otherwise.
  const file = parse(shippedConfig().text) as Record<string, Record<string, unknown>>
  file.keyCache = { ...file.keyCache, maxEntries: keyCacheMaxEntries }
  const configFile = path.join(context.logDir, 'gateway-scale.bench.yaml')
  const text = `# Written by bench/scale/scalePhase.ts for one benchmark run.\n${stringify(file)}`
  parseGatewayConfig(text, 'scale gateway config')
  await writeFile(configFile, text)
  const server = await startChildServer({
    name: 'gateway-scale',
    script: 'gateway/src/main.ts',
    nodeArgs: [...context.nodeArgs, `--inspect=127.0.0.1:${inspectPort}`],
    env: gatewayEnv({ databaseUrl: context.databaseUrl, redisUrl, petsUrl: upstream.origin, configFile, port, opsPort }),
    readyUrl: `http://127.0.0.1:${opsPort}/readyz`,
    logFile: path.join(context.logDir, 'gateway-scale.log'),
  })
  return { server, origin: `http://127.0.0.1:${port}`, opsOrigin: `http://127.0.0.1:${opsPort}`, inspectOrigin: `http://127.0.0.1:${inspectPort}` }
}

async function httpStep(
  name: string,
  keys: string[],
  gateway: ScaleGateway,
  context: ScaleContext,
): Promise<HttpStep> {
  const statuses: Record<string, number> = {}
  let errors = 0
  const before = await gatewayGauges(gateway.opsOrigin)
  const cpuBefore = processCpuSeconds(gateway.server.pid)
  const started = performance.now()
  if (keys.length > 0) {
    const pool = new Pool(gateway.origin, { connections: HTTP_CONNECTIONS, pipelining: 1 })
    try {
      await inParallel(
        keys.length,
        HTTP_CONNECTIONS,
        async (index) => {
          try {
            const response = await pool.request({ path: PROXY_PATH, method: 'GET', headers: { authorization: `Bearer ${keys[index]}` } })
            await response.body.dump()
            statuses[response.statusCode] = (statuses[response.statusCode] ?? 0) + 1
          } catch {
            errors++
          }
        },
        undefined,
        context.checkInterrupted,
      )
    } finally {
      await pool.close()
    }
  }
  const seconds = (performance.now() - started) / 1_000
  const cpuAfter = processCpuSeconds(gateway.server.pid)
  const failure = gateway.server.exitReason()
  if (failure !== undefined) throw new Error(`the scale gateway ${failure} during "${name}"`)
  await delay(500)
  const memory = gatewayMemory(gateway.server.pid)
  const after = await gatewayGauges(gateway.opsOrigin)
  const entries = after?.keyCacheEntries
  const fallback = before && after ? (after.decisionsBySource.fallback ?? 0) - (before.decisionsBySource.fallback ?? 0) : undefined
  // Then the live heap and RSS once a full GC has run: what the process keeps, not what it has not freed yet.
  const collected = await collectGarbage(gateway.inspectOrigin)
  const afterGc = collected ? await gatewayGauges(gateway.opsOrigin) : undefined
  const memoryAfterGc = collected ? gatewayMemory(gateway.server.pid) : undefined
  const step: HttpStep = {
    name,
    distinctKeys: keys.length,
    seconds,
    requestsPerSecond: keys.length === 0 ? 0 : keys.length / seconds,
    statuses,
    errors,
    ...memory,
    ...(entries === undefined ? {} : { keyCacheEntries: entries }),
    ...(after?.heapUsedBytes === undefined ? {} : { heapUsedBytes: after.heapUsedBytes }),
    ...(fallback === undefined ? {} : { fallbackDecisions: fallback }),
    ...(cpuBefore === undefined || cpuAfter === undefined || keys.length === 0
      ? {}
      : { gatewayCpuMicrosPerRequest: ((cpuAfter - cpuBefore) * 1e6) / keys.length }),
    ...(afterGc?.heapUsedBytes === undefined ? {} : { liveHeapBytes: afterGc.heapUsedBytes }),
    ...(memoryAfterGc === undefined ? {} : { rssAfterGcBytes: memoryAfterGc.rssBytes }),
  }
  context.progress(
    `scale: gateway ${name}: ${keys.length} new keys, ${Math.round(step.requestsPerSecond)} req/s, ` +
      `${step.gatewayCpuMicrosPerRequest === undefined ? '' : `${Math.round(step.gatewayCpuMicrosPerRequest)} µs CPU/req, `}RSS ${round1(memory.rssBytes / 1048576)} MB, ` +
      `heap ${after?.heapUsedBytes === undefined ? 'n/a' : round1(after.heapUsedBytes / 1048576)} MB ` +
      `(after a full GC ${afterGc?.heapUsedBytes === undefined ? 'n/a' : round1(afterGc.heapUsedBytes / 1048576)} MB), key cache ${entries ?? 'n/a'}, fallback decisions ${fallback ?? 'n/a'}`,
  )
  return step
}

async function driveHttp(context: ScaleContext, redisUrl: string, keyCacheMaxEntries: number): Promise<HttpScale> {
  const sampleKeys = Math.min(context.httpSampleKeys ?? 2_000, Math.max(1, Math.floor(keyCacheMaxEntries / 2)))
  const burst = Math.ceil(BURST_OF_CACHE * keyCacheMaxEntries)
  const total = sampleKeys + BURSTS * burst
  const insertStarted = performance.now()
  const keys = await insertKeys(context.databaseUrl, total)
  const insertSeconds = (performance.now() - insertStarted) / 1_000
  context.progress(`scale: inserted ${total} real keys into the bench database in ${round1(insertSeconds)} s`)
  context.checkInterrupted?.()
  const gateway = await startScaleGateway(context, redisUrl, keyCacheMaxEntries)
  try {
    const steps: HttpStep[] = []
    steps.push(await httpStep('start (no request yet)', [], gateway, context))
    steps.push(await httpStep(`a sample of ${sampleKeys.toLocaleString('en-US')} keys`, keys.slice(0, sampleKeys), gateway, context))
    for (let index = 0; index < BURSTS; index++) {
      const from = sampleKeys + index * burst
      steps.push(await httpStep(`burst ${index + 1} (${BURST_OF_CACHE} × key cache, new keys)`, keys.slice(from, from + burst), gateway, context))
    }
    return { gatewayPid: gateway.server.pid, keyCacheMaxEntries, keysInserted: total, insertSeconds, connections: HTTP_CONNECTIONS, steps }
  } finally {
    await gateway.server.stop()
  }
}

/** Runs the whole scale phase; its own redis-server and gateway are stopped before it returns. */
export async function runScalePhase(context: ScaleContext): Promise<ScaleReport> {
  const startedAt = new Date().toISOString()
  const loadStart = Math.round((os.loadavg()[0] ?? 0) * 100) / 100
  const { config } = shippedConfig()
  const keyCacheMaxEntries = context.keyCacheMaxEntries ?? config.keyCache.maxEntries
  const redis = await startPrivateRedis(context.logDir)
  const probe = new Redis(redis.url, { maxRetriesPerRequest: 1 })
  probe.on('error', () => undefined)
  try {
    context.progress(`scale: ${context.keys.toLocaleString('en-US')} distinct keys through the store on a private redis-server (${redis.url})`)
    const usedBefore = infoNumber(parseInfo(await probe.info('memory')), 'used_memory')
    const store = await driveStore(context, redis, probe, config)
    context.checkInterrupted?.()
    const memory = await measureMemory(probe, context.keys, usedBefore)
    context.progress(
      `scale: ${round1(store.decisionsPerSecond)} decisions/s; ${round1(memory.bytesPerKeyDelta)} bytes per key (used_memory delta), ` +
        `${round1(memory.memoryUsage.mean)} (MEMORY USAGE); ${memory.keyspace.expires} of ${memory.keyspace.keys} keys with a TTL`,
    )
    const benchmark = await redisBenchmark(context, redis, probe, config)
    if (typeof benchmark !== 'string') context.progress(`scale: redis-benchmark EVALSHA ${Math.round(benchmark.requestsPerSecond)}/s`)
    context.checkInterrupted?.()
    const http = context.skipHttp ? undefined : await driveHttp(context, redis.url, keyCacheMaxEntries)

    const problems: string[] = []
    if (store.errors > 0) problems.push(`scale: ${store.errors} store decisions failed`)
    const notAdmitted = context.keys - (store.outcomes.admitted ?? 0)
    if (notAdmitted > 0) problems.push(`scale: ${notAdmitted} of the store drive's first requests were not admitted`)
    if (typeof benchmark !== 'string' && benchmark.errorReplies > 0) {
      problems.push(`scale: redis-benchmark got ${benchmark.errorReplies} error replies (its EVALSHA arguments no longer match redisStore.ts?)`)
    }
    for (const step of http?.steps ?? []) {
      const unexpected = Object.entries(step.statuses).filter(([status]) => status !== '200').reduce((sum, [, n]) => sum + n, 0)
      if (unexpected + step.errors > 0) problems.push(`scale: gateway ${step.name}: ${unexpected} responses other than 200, ${step.errors} request errors`)
    }
    const partial = { keys: context.keys, memory, ...(http === undefined ? {} : { http }) }
    return {
      startedAt,
      keys: context.keys,
      plan: `${SCALE_PLAN} (${config.plans[SCALE_PLAN]?.perMinute}/min, ${config.plans[SCALE_PLAN]?.perDay}/day)`,
      windows: describeWindows(config),
      store,
      memory,
      ...(typeof benchmark === 'string' ? { redisBenchmarkSkipped: benchmark } : { redisBenchmark: benchmark }),
      ...(http === undefined ? {} : { http }),
      targets: evaluateScaleTargets(partial),
      problems,
      loadAverage: { start: loadStart, end: Math.round((os.loadavg()[0] ?? 0) * 100) / 100 },
    }
  } finally {
    probe.disconnect()
    await redis.stop()
  }
}

/**
 * The hook `npm run bench` calls at the end of a run: the scale phase with BENCH_SCALE_KEYS keys
 * (default 1,000,000), or nothing when BENCH_SCALE_KEYS=0.
 */
export async function runScaleFromEnv(context: Omit<ScaleContext, 'keys'>, env: NodeJS.ProcessEnv = process.env): Promise<ScaleReport | undefined> {
  const keys = scaleKeysFromEnv(env)
  if (keys === 0) return undefined
  return runScalePhase({ ...context, keys })
}
