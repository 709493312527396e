import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { runScalePhase, type ScaleReport } from '../../bench/scale/scalePhase.ts'
import type { SharedService } from '../../bench/targets/types.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/**
 * The scale phase of `npm run bench`, small: 3,000 distinct keys through the gateway's Redis store
 * on a private redis-server, then real keys through a real gateway process whose key cache holds
 * 500, in bursts past it. What it proves is the product's: every rate-limit key in Redis expires
 * and costs well under 400 bytes, every real key is answered 200, and the gateway's live heap
 * stops growing once its key cache is full.
 */
const KEYS = 3_000
const KEY_CACHE = 500

const database = suiteDatabase()
let logDir: string
const started = new Map<string, Promise<SharedService>>()
let report: ScaleReport

beforeAll(async () => {
  logDir = await mkdtemp(path.join(os.tmpdir(), 'aas-scale-test-'))
  report = await runScalePhase({
    databaseUrl: database.url,
    logDir,
    nodeArgs: [],
    shared<T extends SharedService>(id: string, start: () => Promise<T>): Promise<T> {
      if (!started.has(id)) started.set(id, start())
      return started.get(id) as Promise<T>
    },
    keys: KEYS,
    progress: () => undefined,
    inFlight: 64,
    httpSampleKeys: 200,
    keyCacheMaxEntries: KEY_CACHE,
    skipRedisBenchmark: true,
  })
}, 90_000)

afterAll(async () => {
  for (const service of started.values()) await (await service.catch(() => undefined))?.stop()
  await rm(logDir, { recursive: true, force: true })
})

describe('many distinct keys through the limiter', () => {
  it('admits each new key once and leaves one expiring Redis key of under 400 bytes per API key', () => {
    expect(report.store.outcomes).toEqual({ admitted: KEYS })
    expect(report.store.errors).toBe(0)
    expect(report.store.commands.evalsha ?? 0).toBeGreaterThanOrEqual(KEYS - 1) // the first may go as EVAL (NOSCRIPT)
    expect(report.memory.dbsize).toBe(KEYS)
    expect(report.memory.keyspace).toEqual({ keys: KEYS, expires: KEYS })
    expect(report.memory.ttl.withTtl).toBe(report.memory.ttl.sampled)
    expect(report.memory.ttl.sampled).toBe(2_000)
    // The day window (24 h) plus one bucket (1 h): the state lives exactly as long as it can matter.
    expect(report.memory.ttl.maxMillis).toBeLessThanOrEqual(25 * 3_600_000)
    expect(report.memory.ttl.minMillis).toBeGreaterThan(24 * 3_600_000)
    // MEMORY USAGE per key; the used_memory delta over only 3,000 keys still carries Redis's fixed costs.
    expect(report.memory.memoryUsage.max).toBeLessThanOrEqual(400)
    expect(report.targets[0]?.met).toBe(true)
  })

  it('answers every real key 200 through a real gateway, and its live heap stops growing once the key cache is full', () => {
    const http = report.http
    expect(http).toBeDefined()
    if (!http) return
    const steps = http.steps.filter((step) => step.distinctKeys > 0)
    expect(steps.map((step) => step.distinctKeys)).toEqual([200, 600, 600, 600])
    for (const step of steps) {
      expect(step.statuses).toEqual({ 200: step.distinctKeys })
      expect(step.errors).toBe(0)
    }
    expect(steps.at(-1)?.keyCacheEntries).toBe(KEY_CACHE)
    const [previous, last] = [steps.at(-2), steps.at(-1)]
    expect(previous?.liveHeapBytes).toBeDefined()
    const growth = (last?.liveHeapBytes ?? Infinity) - (previous?.liveHeapBytes ?? 0)
    // A thousand and more keys past a 500-entry cache: live data may wobble, not follow the keys.
    expect(growth).toBeLessThan(0.1 * (previous?.liveHeapBytes ?? 0))
    expect(report.problems).toEqual([])

    const mb = (bytes: number | undefined) => `${Math.round(((bytes ?? 0) / 1_048_576) * 10) / 10} MB`
    recordScenario({
      area: 'Load',
      scenario: `${KEYS.toLocaleString('en-US')} distinct keys through the Redis store; then ${steps.reduce((sum, step) => sum + step.distinctKeys, 0).toLocaleString('en-US')} real keys, each once, through a gateway whose key cache holds ${KEY_CACHE}`,
      answered:
        `every key admitted; ${report.memory.memoryUsage.max} bytes per Redis key (MEMORY USAGE), every key with a TTL ≤ 25 h; ` +
        `gateway 200 to every key, live heap ${mb(previous?.liveHeapBytes)} → ${mb(last?.liveHeapBytes)} over the last burst, RSS ${mb(last?.rssBytes)}`,
      lost: `nothing: ${report.memory.keyspace.expires} of ${report.memory.keyspace.keys} Redis keys expiring, no request error, no status other than 200`,
      test: 'test/bench/scalePhase.int.test.ts',
    })
  })
})
