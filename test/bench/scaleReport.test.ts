import { describe, expect, it } from 'vitest'
import {
  DEFAULT_SCALE_KEYS,
  evaluateScaleTargets,
  parseCommandTimes,
  parseGatewayMetrics,
  parseInfo,
  parseKeyspace,
  parseProcStatusMemory,
  parseRedisBenchmarkCsv,
  renderScaleSection,
  scaleKeyId,
  scaleKeysFromEnv,
  spreadSample,
  type HttpScale,
  type RedisMemory,
  type ScaleReport,
} from '../../bench/scale/scaleReport.ts'

const MB = 1024 * 1024

function memory(overrides: Partial<RedisMemory> = {}): RedisMemory {
  return {
    usedBytesBefore: 1 * MB,
    usedBytesAfter: 1 * MB + 1_000_000 * 300,
    bytesPerKeyDelta: 300,
    rssBytesAfter: 320 * MB,
    memoryUsage: { count: 2_000, mean: 296, min: 296, max: 296 },
    valueBytes: 204,
    dbsize: 1_000_000,
    keyspace: { keys: 1_000_000, expires: 1_000_000 },
    ttl: { sampled: 2_000, withTtl: 2_000, missing: 0, persistent: 0, minMillis: 90_000_000, maxMillis: 90_000_000 },
    ...overrides,
  }
}

function http(rssMegabytes: number[]): HttpScale {
  const names = ['start', 'sample', 'burst 1', 'burst 2', 'burst 3']
  const keys = [0, 2_000, 12_000, 12_000, 12_000]
  return {
    gatewayPid: 1,
    keyCacheMaxEntries: 10_000,
    keysInserted: 38_000,
    insertSeconds: 2,
    connections: 32,
    steps: rssMegabytes.map((rss, index) => ({
      name: names[index] ?? `step ${index}`,
      distinctKeys: keys[index] ?? 12_000,
      seconds: 10,
      requestsPerSecond: 1_000,
      statuses: { 200: keys[index] ?? 12_000 },
      errors: 0,
      rssBytes: rss * MB,
      peakRssBytes: rss * MB,
      keyCacheEntries: index >= 2 ? 10_000 : (keys[index] ?? 0),
      heapUsedBytes: 40 * MB,
      fallbackDecisions: 0,
    })),
  }
}

describe('BENCH_SCALE_KEYS', () => {
  it('defaults to a million keys, reads underscores, and 0 means skip', () => {
    expect(scaleKeysFromEnv({})).toBe(DEFAULT_SCALE_KEYS)
    expect(DEFAULT_SCALE_KEYS).toBe(1_000_000)
    expect(scaleKeysFromEnv({ BENCH_SCALE_KEYS: '2_000_000' })).toBe(2_000_000)
    expect(scaleKeysFromEnv({ BENCH_SCALE_KEYS: '0' })).toBe(0)
  })

  it('refuses what is not a whole number of keys', () => {
    expect(() => scaleKeysFromEnv({ BENCH_SCALE_KEYS: '-1' })).toThrow(/integer ≥ 0/)
    expect(() => scaleKeysFromEnv({ BENCH_SCALE_KEYS: '1e3.5' })).toThrow(/BENCH_SCALE_KEYS/)
    expect(() => scaleKeysFromEnv({ BENCH_SCALE_KEYS: 'lots' })).toThrow(/BENCH_SCALE_KEYS/)
  })
})

describe('scale key ids', () => {
  it('are as long as a real key id and what redis-benchmark __rand_int__ expands to', () => {
    expect(scaleKeyId(0)).toBe('key_000000000000')
    expect(scaleKeyId(999_999)).toBe('key_000000999999')
    // A real id: key_ + 12 base64url characters (generateKeyId in gateway/src/keys/apiKeyFormat.ts).
    expect(scaleKeyId(123)).toHaveLength('key_'.length + 12)
  })
})

describe('what Redis and /proc say', () => {
  it('reads INFO fields and the keyspace line', () => {
    const info = '# Memory\r\nused_memory:1234567\r\nused_memory_rss:2000000\r\n\r\n# Keyspace\r\ndb0:keys=1000000,expires=999999,avg_ttl=89000000\r\n'
    expect(parseInfo(info).get('used_memory')).toBe('1234567')
    expect(parseKeyspace(info)).toEqual({ keys: 1_000_000, expires: 999_999 })
    expect(parseKeyspace('# Keyspace\r\n')).toEqual({ keys: 0, expires: 0 })
  })

  it("reads each command's calls and the time Redis spent in it from INFO commandstats", () => {
    const info = '# Commandstats\r\ncmdstat_evalsha:calls=100000,usec=2650000,usec_per_call=26.50,rejected_calls=0,failed_calls=0\r\ncmdstat_get:calls=7,usec=21,usec_per_call=3.00\r\n'
    const times = parseCommandTimes(info)
    expect(times.get('evalsha')).toEqual({ calls: 100_000, usec: 2_650_000 })
    expect(times.get('get')).toEqual({ calls: 7, usec: 21 })
    expect(times.has('set')).toBe(false)
  })

  it('reads RSS and peak RSS in bytes from /proc/<pid>/status', () => {
    const status = 'Name:\tnode\nVmHWM:\t  204800 kB\nVmRSS:\t  153600 kB\nThreads:\t11\n'
    expect(parseProcStatusMemory(status)).toEqual({ rssBytes: 150 * MB, peakRssBytes: 200 * MB })
    expect(() => parseProcStatusMemory('Name:\tnode\n')).toThrow(/VmRSS/)
  })

  it("reads redis-benchmark's rate even when the command's arguments hold commas", () => {
    const csv =
      '"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"\n' +
      '"EVALSHA abc 1 rl:{key___rand_int__} 0 60 60000 5000 1000 86400000 3600000 10 60000 86400000 60000,300000,900000","8816.79","90.008","1.512","76.607","196.351","252.671","320.511"\n'
    expect(parseRedisBenchmarkCsv(csv)).toBe(8816.79)
    expect(() => parseRedisBenchmarkCsv('"test","rps"\n')).toThrow(/no requests-per-second/)
  })

  it("reads the key cache, the heap and the decisions by source from a gateway's /metrics", () => {
    const text = [
      '# HELP gateway_key_cache_entries API keys held',
      'gateway_key_cache_entries 10000',
      'nodejs_heap_size_used_bytes 41943040',
      'gateway_rate_limit_requests_total{plan="free",window="minute",outcome="admitted",source="store"} 120',
      'gateway_rate_limit_requests_total{plan="free",window="minute",outcome="admitted",source="fallback"} 3',
      'gateway_rate_limit_requests_total{plan="pro",window="minute",outcome="admitted",source="fallback"} 2',
    ].join('\n')
    expect(parseGatewayMetrics(text)).toEqual({
      keyCacheEntries: 10_000,
      heapUsedBytes: 40 * MB,
      decisionsBySource: { store: 120, fallback: 5 },
    })
  })
})

describe('the memory sample', () => {
  it('picks distinct indices spread over the whole range', () => {
    const sample = spreadSample(1_000, 1_000_000, () => 0.5)
    expect(new Set(sample).size).toBe(1_000)
    expect(Math.min(...sample)).toBeLessThan(1_000)
    expect(Math.max(...sample)).toBeGreaterThan(998_000)
    expect(sample.every((index) => index >= 0 && index < 1_000_000)).toBe(true)
  })

  it('takes every key when there are fewer keys than the sample', () => {
    expect(spreadSample(2_000, 5, () => 0.99).sort()).toEqual([0, 1, 2, 3, 4])
    expect(spreadSample(10, 0)).toEqual([])
  })
})

describe('scale targets', () => {
  it('are met when a key costs ≤ 400 bytes, every key expires and RSS stays flat under 250 MB', () => {
    const targets = evaluateScaleTargets({ keys: 1_000_000, memory: memory(), http: http([150, 170, 200, 205, 206]) })
    expect(targets.map((target) => [target.label.split(':')[0], target.met])).toEqual([
      ['Redis ≤ 400 bytes per active key', true],
      ['every rate-limit key has a TTL', true],
      ['gateway RSS ≤ 250 MB', true],
      ['gateway memory bounded by the key cache', true],
    ])
  })

  it('miss the byte budget on either measure', () => {
    expect(evaluateScaleTargets({ keys: 1_000_000, memory: memory({ bytesPerKeyDelta: 401 }) })[0]?.met).toBe(false)
    const heavy = memory({ memoryUsage: { count: 2_000, mean: 380, min: 296, max: 440 } })
    expect(evaluateScaleTargets({ keys: 1_000_000, memory: heavy })[0]?.met).toBe(false)
  })

  it('judge a small run by MEMORY USAGE alone, where Redis fixed costs still weigh on the used_memory delta', () => {
    const small = evaluateScaleTargets({ keys: 3_000, memory: memory({ bytesPerKeyDelta: 401 }) })[0]
    expect(small?.met).toBe(true)
    expect(small?.measured).toContain('not judged below 100,000 keys')
    const heavy = memory({ bytesPerKeyDelta: 380, memoryUsage: { count: 2_000, mean: 401, min: 401, max: 401 } })
    expect(evaluateScaleTargets({ keys: 3_000, memory: heavy })[0]?.met).toBe(false)
  })

  it('miss the TTL target when one key has no expiry or a sampled key is missing', () => {
    const persistent = memory({ keyspace: { keys: 1_000_000, expires: 999_999 } })
    expect(evaluateScaleTargets({ keys: 1_000_000, memory: persistent })[1]?.met).toBe(false)
    const missing = memory({ ttl: { sampled: 2_000, withTtl: 1_999, missing: 1, persistent: 0, minMillis: 1, maxMillis: 2 } })
    const target = evaluateScaleTargets({ keys: 1_000_000, memory: missing })[1]
    expect(target?.met).toBe(false)
    expect(target?.measured).toContain('1 missing')
  })

  it('miss the RSS targets when the gateway grows past 250 MB or keeps growing once the cache is full', () => {
    const targets = evaluateScaleTargets({ keys: 1_000_000, memory: memory(), http: http([150, 180, 210, 240, 270]) })
    expect(targets[2]?.met).toBe(false)
    expect(targets[2]?.measured).toContain('270 MB after burst 3')
    expect(targets[3]?.met).toBe(false)
    expect(targets[3]?.measured).toContain('+30 MB (240 MB → 270 MB)')
  })
})

describe('memory bounded by the key cache', () => {
  it('is judged on the live heap after a full GC when the gateway reported it, not on garbage not yet collected', () => {
    const scale = http([150, 170, 200, 230, 260])
    const live = [0, 30, 40, 41, 42]
    scale.steps.forEach((step, index) => (step.liveHeapBytes = (live[index] ?? 0) * MB))
    const target = evaluateScaleTargets({ keys: 1_000_000, memory: memory(), http: scale })[3]
    expect(target?.label).toContain('live heap (after a full GC)')
    expect(target?.met).toBe(true)
    expect(target?.measured).toContain('live heap +1 MB (41 MB → 42 MB)')
  })

  it('is missed when the live heap keeps growing with the number of keys', () => {
    const scale = http([150, 170, 200, 230, 260])
    const live = [0, 30, 40, 60, 80]
    scale.steps.forEach((step, index) => (step.liveHeapBytes = (live[index] ?? 0) * MB))
    expect(evaluateScaleTargets({ keys: 1_000_000, memory: memory(), http: scale })[3]?.met).toBe(false)
  })
})

describe('the markdown section', () => {
  it('shows the measured numbers and each target as met or MISSED', () => {
    const report: ScaleReport = {
      startedAt: '2026-11-22T05:00:00.000Z',
      keys: 1_000_000,
      plan: 'free (60/min, 1000/day)',
      windows: '60 s in 5 s buckets, 24 h in 1 h buckets',
      store: {
        keys: 1_000_000,
        inFlight: 256,
        seconds: 80,
        decisionsPerSecond: 12_500,
        outcomes: { admitted: 1_000_000 },
        errors: 0,
        redisCpuMicrosPerDecision: 27,
        redisCpuPercent: 34,
        clientCpuMicrosPerDecision: 30,
        commands: { evalsha: 999_999, eval: 1 },
      },
      memory: memory(),
      redisBenchmarkSkipped: 'not asked for',
      http: http([150, 170, 200, 205, 300]),
      targets: [],
      problems: ['scale: 3 store decisions failed'],
      loadAverage: { start: 2, end: 3 },
    }
    report.targets = evaluateScaleTargets(report)
    const markdown = renderScaleSection(report)
    expect(markdown).toMatch(/^## Scale of keys/)
    expect(markdown).toContain('| decisions | 1,000,000 in 80 s (12,500/s) |')
    expect(markdown).toContain('| bytes per key, used_memory delta ÷ keys | 300 |')
    expect(markdown).toContain('skipped: not asked for')
    expect(markdown).toContain('- Redis ≤ 400 bytes per active key: met')
    expect(markdown).toContain('- gateway RSS ≤ 250 MB: **MISSED**')
    expect(markdown).toContain('- scale: 3 store decisions failed')
  })
})
