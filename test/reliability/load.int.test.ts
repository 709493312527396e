import { existsSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import { Redis } from 'ioredis'
import { Pool } from 'undici'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { bulkInsertKeys, mostAdmittedInAnyWindow, staticUpstream, type IssuedKey } from '../helpers/loadTools.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../helpers/redis.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { SOAK, maxOf, minOf, percentile, printedInSoak, scaled } from '../helpers/soak.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { startGatewayProcess, type GatewayProcess } from '../ops/gatewayProcess.ts'
import { killAll } from '../scripts/processes.ts'

const TEST = 'test/reliability/load.int.test.ts'
/** The "minute" window shortened to 10 s (1 s buckets) so several whole windows pass within a test. */
const WINDOW_MILLIS = 10_000
// Fewer admissions per second (keys × limit ÷ window) than the machine serves, so keys hit 429.
const LIMIT = scaled(20, 10)
const LOAD_KEYS = scaled(300, 1_000)
const LOAD_MILLIS = scaled(12_000, 120_000)
const HOT_KEYS = 10
const CONCURRENCY = scaled(32, 64)
/** Distinct keys sent through one gateway for the heap measurement; its key cache holds 10,000. */
const DISTINCT_KEYS = scaled(24_000, 100_000)
/** Keys sent before the baseline heap is taken: the cache is full by then. */
const WARM_KEYS = 12_000
const HEAP_PROBE = path.resolve(import.meta.dirname, '../helpers/heapProbe.ts')

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

interface Gateway {
  process: GatewayProcess & { cleanup(): void }
  client: Pool
  heapFile: string
}

describe('load held by three gateways sharing one Redis', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  let upstream: Awaited<ReturnType<typeof staticUpstream>>
  let gateways: Gateway[] = []
  let loadKeys: IssuedKey[]
  /** Load keys the load test sent at least once: each has one state key in Redis. */
  const usedLoadKeys = new Set<string>()
  let distinctKeys: IssuedKey[]

  /** Full GC in the gateway process, then its heap in use (bytes). */
  async function heapAfterGc(gateway: Gateway): Promise<{ heapUsed: number; rss: number }> {
    const lines = () => (existsSync(gateway.heapFile) ? readFileSync(gateway.heapFile, 'utf8').trim().split('\n').filter(Boolean) : [])
    const before = lines().length
    process.kill(gateway.process.proc.pid, 'SIGUSR2')
    const deadline = Date.now() + 10_000
    while (lines().length === before) {
      if (Date.now() > deadline) throw new Error('the gateway did not report its heap within 10 s')
      await sleep(50)
    }
    return JSON.parse(lines().at(-1)!) as { heapUsed: number; rss: number }
  }

  async function metric(gateway: Gateway, name: string, labels: Record<string, string> = {}): Promise<number> {
    const text = await (await fetch(`${gateway.process.opsUrl}/metrics`)).text()
    let sum = 0
    for (const line of text.split('\n')) {
      if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue
      if (Object.entries(labels).every(([label, value]) => line.includes(`${label}="${value}"`))) sum += Number(line.split(' ').at(-1))
    }
    return sum
  }

  beforeAll(async () => {
    const pool = createPool({ connectionString: database.url, applicationName: 'load-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    await pool.end()
    loadKeys = await bulkInsertKeys(database.url, LOAD_KEYS, { perMinute: LIMIT, perDay: 10_000_000 })
    distinctKeys = await bulkInsertKeys(database.url, DISTINCT_KEYS, { perMinute: 1_000, perDay: 1_000 })
    upstream = await staticUpstream()
    gateways = await Promise.all(
      [0, 1, 2].map(async (index) => {
        const heapFile = path.join(os.tmpdir(), `aas-heap-${process.pid}-${prefix.replace(/\W/g, '')}-${index}.jsonl`)
        const gatewayProcess = await startGatewayProcess({
          databaseUrl: database.url,
          petsUrl: upstream.url,
          readyTimeoutMillis: 60_000,
          env: {
            REDIS_URL: TEST_REDIS_URL,
            NODE_OPTIONS: `--expose-gc --import tsx --import ${pathToFileURL(HEAP_PROBE).href}`,
            HEAP_PROBE_FILE: heapFile,
          },
          configure: (file) => {
            file.windows.minute = { length: `${WINDOW_MILLIS / 1_000}s`, bucket: '1s' }
            // The windows are under test here, not the bans.
            file.bans = { strikes: 1_000_000, ladder: ['60s'] }
            file.anonymous.perMinute = 1_000_000
            file.redis.keyPrefix = prefix
            // As in the replica tests: a loaded 2-core machine can keep Redis from answering within
            // the production 50 ms, which by design hands decisions to per-process limits.
            file.redis.commandTimeoutMillis = 1_000
          },
        })
        return { process: gatewayProcess, client: new Pool(gatewayProcess.url, { connections: CONCURRENCY }), heapFile }
      }),
    )
  }, 120_000)

  afterAll(async () => {
    for (const gateway of gateways) {
      await gateway.client.close().catch(() => undefined)
      gateway.process.cleanup()
      rmSync(gateway.heapFile, { force: true })
    }
    await killAll()
    await upstream?.close()
  })

  async function call(gateway: Gateway, key: string): Promise<number> {
    const { statusCode, body } = await gateway.client.request({
      path: '/v1/pets?limit=1',
      method: 'GET',
      headers: { authorization: `Bearer ${key}` },
    })
    await body.dump()
    return statusCode
  }

  it(
    `${CONCURRENCY} clients on ${LOAD_KEYS} keys through three gateways for ${LOAD_MILLIS / 1000} s: no key over its limit in any ${WINDOW_MILLIS / 1000} s span, no 5xx`,
    async () => {
      const admitted = new Map<string, Array<{ sent: number; answered: number }>>()
      const statuses = new Map<number, number>()
      const failures: string[] = []
      const latencies: number[] = []
      const startedAt = performance.now()
      const until = startedAt + LOAD_MILLIS
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          while (performance.now() < until) {
            // Half the requests go to ten hot keys, hammered far past their limit however slow the
            // machine is (and raced across the three gateways); the rest spread over every key.
            const range = Math.random() < 0.5 ? HOT_KEYS : loadKeys.length
            const { key } = loadKeys[Math.floor(Math.random() * range)]!
            usedLoadKeys.add(key)
            const gateway = gateways[Math.floor(Math.random() * gateways.length)]!
            const sent = performance.now()
            try {
              const status = await call(gateway, key)
              const answered = performance.now()
              latencies.push(answered - sent)
              statuses.set(status, (statuses.get(status) ?? 0) + 1)
              if (status === 200) {
                const list = admitted.get(key) ?? []
                list.push({ sent, answered })
                admitted.set(key, list)
              }
            } catch (error) {
              failures.push(String(error))
            }
          }
        }),
      )
      const spanMillis = performance.now() - startedAt
      const total = latencies.length
      const count = (status: number) => statuses.get(status) ?? 0
      expect(failures).toEqual([])
      // Every answer is an admission or a refusal: no 5xx, nothing else.
      expect({ other: total - count(200) - count(429) }).toEqual({ other: 0 })
      expect(count(429), 'the load must push keys past their limit').toBeGreaterThan(0)
      const hotAdmitted = loadKeys.slice(0, HOT_KEYS).map(({ key }) => admitted.get(key)?.length ?? 0)
      // Each hot key was admitted up to its limit (under-admission is at most one bucket).
      for (const hot of hotAdmitted) expect(hot).toBeGreaterThanOrEqual(LIMIT)
      let worstWindow = 0
      let worstTotal = 0
      const totalBound = LIMIT * (Math.floor(spanMillis / WINDOW_MILLIS) + 1)
      for (const [key, list] of admitted) {
        const most = mostAdmittedInAnyWindow(list, WINDOW_MILLIS)
        expect(most, `key ${key.slice(0, 10)}… admitted ${most} within one ${WINDOW_MILLIS} ms span`).toBeLessThanOrEqual(LIMIT)
        expect(list.length).toBeLessThanOrEqual(totalBound)
        worstWindow = Math.max(worstWindow, most)
        worstTotal = Math.max(worstTotal, list.length)
      }
      let fallback = 0
      let storeErrors = 0
      for (const gateway of gateways) {
        fallback += await metric(gateway, 'gateway_rate_limit_requests_total', { source: 'fallback' })
        storeErrors += await metric(gateway, 'gateway_rate_limit_store_errors_total')
      }
      recordScenario(printedInSoak({
        area: 'Load',
        scenario: `${CONCURRENCY} concurrent clients on ${LOAD_KEYS} keys (half the requests on ${HOT_KEYS} hot keys; limit ${LIMIT} per ${WINDOW_MILLIS / 1000} s window) through three gateway processes sharing one Redis, for ${Math.round(spanMillis / 1000)} s`,
        answered: `${total} requests (${Math.round(total / (spanMillis / 1000))}/s): ${count(200)} × 200, ${count(429)} × 429, 0 × 5xx; latency p50 ${Math.round(percentile(latencies, 50))} ms, p99 ${Math.round(percentile(latencies, 99))} ms, max ${Math.round(maxOf(latencies))} ms; Redis errors ${storeErrors}, fallback decisions ${fallback}`,
        lost: `nothing over-admitted: at most ${worstWindow} of ${LIMIT} admitted in any ${WINDOW_MILLIS / 1000} s span on any key, at most ${worstTotal} per key in the run (bound ${totalBound})`,
        test: TEST,
      }))
    },
    LOAD_MILLIS + 60_000,
  )

  it(
    `the heap of a gateway after a full GC stays flat across ${DISTINCT_KEYS.toLocaleString('en')} distinct keys`,
    async () => {
      const gateway = gateways[0]!
      const statuses = new Map<number, number>()
      const samples: Array<{ keys: number; heapUsed: number; rss: number }> = []
      let next = 0
      const send = async (upTo: number) => {
        await Promise.all(
          Array.from({ length: CONCURRENCY }, async () => {
            while (next < upTo) {
              const { key } = distinctKeys[next++]!
              const status = await call(gateway, key)
              statuses.set(status, (statuses.get(status) ?? 0) + 1)
            }
          }),
        )
      }
      const startedAt = performance.now()
      await send(WARM_KEYS)
      samples.push({ keys: WARM_KEYS, ...(await heapAfterGc(gateway)) })
      const step = scaled(DISTINCT_KEYS, 22_000)
      for (let upTo = WARM_KEYS + step; next < DISTINCT_KEYS; upTo += step) {
        await send(Math.min(upTo, DISTINCT_KEYS))
        samples.push({ keys: next, ...(await heapAfterGc(gateway)) })
      }
      const seconds = (performance.now() - startedAt) / 1000
      expect(Object.fromEntries(statuses)).toEqual({ 200: DISTINCT_KEYS })
      const cacheEntries = await metric(gateway, 'gateway_key_cache_entries')
      expect(cacheEntries).toBeLessThanOrEqual(10_000)
      const baseline = samples[0]!
      const last = samples.at(-1)!
      const growth = last.heapUsed - baseline.heapUsed
      const perKey = growth / (last.keys - baseline.keys)
      // Samples of a flat heap differ by up to ~0.5 MB. A cache without its bound keeps ~680 bytes
      // per key (measured with keyCache.maxEntries 1,000,000: +12 MB over 18,000 keys), so 2 MiB
      // over 12,000 or more new keys catches anything kept per key.
      expect(growth, `heap grew ${growth} bytes over ${last.keys - baseline.keys} new keys`).toBeLessThan(2 * 1024 * 1024)
      const mb = (bytes: number) => (bytes / 1024 / 1024).toFixed(1)
      recordScenario(printedInSoak({
        area: 'Load',
        scenario: `${DISTINCT_KEYS.toLocaleString('en')} distinct valid keys, each used once, through one gateway process (key cache bound 10,000)`,
        answered: `all ${DISTINCT_KEYS.toLocaleString('en')} got 200 in ${Math.round(seconds)} s; heap after full GC ${samples.map((sample) => `${mb(sample.heapUsed)} MB at ${sample.keys.toLocaleString('en')} keys`).join(', ')}; key cache ${cacheEntries} entries`,
        lost: `nothing kept per key: heap ${growth >= 0 ? '+' : ''}${mb(growth)} MB (${perKey.toFixed(1)} bytes per key) from ${baseline.keys.toLocaleString('en')} to ${last.keys.toLocaleString('en')} keys; rss ${mb(last.rss)} MB`,
        test: TEST,
      }))
    },
    scaled(120_000, 600_000),
  )

  it('every Redis key the run wrote has a TTL', async () => {
    const redis = new Redis(TEST_REDIS_URL)
    const ttls: number[] = []
    try {
      let cursor = '0'
      do {
        const [nextCursor, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
        cursor = nextCursor
        if (keys.length === 0) continue
        const pipeline = redis.pipeline()
        for (const key of keys) pipeline.pttl(key)
        for (const [error, ttl] of (await pipeline.exec()) ?? []) {
          expect(error).toBeNull()
          ttls.push(ttl as number)
        }
      } while (cursor !== '0')
    } finally {
      redis.disconnect()
    }
    // One state key per API key used (the keys of both tests), every one expiring. Keys are drawn
    // at random in the load test: on a slow machine a few of its 300 may never have been sent.
    expect(ttls.length).toBeGreaterThanOrEqual(usedLoadKeys.size + DISTINCT_KEYS)
    expect(ttls.filter((ttl) => ttl <= 0)).toEqual([])
    recordScenario(printedInSoak({
      area: 'Load',
      scenario: `SCAN of every Redis key the load tests wrote (${SOAK ? 'soak' : 'npm test'} run, prefix of the run), PTTL of each`,
      answered: `${ttls.length.toLocaleString('en')} keys, every one with a TTL: ${Math.round(minOf(ttls) / 1000)}–${Math.round(maxOf(ttls) / 1000)} s left`,
      lost: 'nothing left to grow forever: 0 keys without a TTL',
      test: TEST,
    }))
  })
})
