import type { Result } from 'autocannon'
import { describe, expect, it } from 'vitest'
import { measurement, type RoundUsage } from '../../bench/lib/load.ts'

/** An autocannon result with only what `measurement` reads. */
function autocannonResult(responses: number): Result {
  return {
    statusCodeStats: { 200: { count: responses } },
    requests: { total: responses },
    duration: 5,
    latency: { p50: 10, p99: 30, average: 12, max: 50 },
    non2xx: 0,
    errors: 0,
    timeouts: 0,
  } as unknown as Result
}

const usage = (counters?: Record<string, number>): RoundUsage => ({
  clientCpuSeconds: 1,
  serverCpuSeconds: 4,
  supportingCpuSeconds: {},
  // 100 requests were still in flight when the round stopped: Redis ran their EVALSHAs, autocannon
  // never counted their responses.
  redisCommands: { evalsha: 20_100, time: 20_100, get: 20_100, set: 20_100 },
  scriptCallsPerEval: { time: 1, get: 1, set: 1 },
  ...(counters === undefined ? {} : { counters }),
})

describe('Redis commands per request in a round', () => {
  it('divides by the rate-limit decisions the gateway counted, which include the requests cut off at the round’s end', () => {
    const m = measurement(1, autocannonResult(20_000), usage({ 'decisions from store': 20_100 }))
    expect(m.redisCommandsPerRequest).toBe(1)
    expect(m.redisEvalsPerRequest).toBe(1)
    expect(m.redisExecutedPerRequest).toBe(4)
  })

  it('divides by the responses when the server has no decision counters', () => {
    const m = measurement(1, autocannonResult(20_000), usage())
    expect(m.redisCommandsPerRequest).toBeCloseTo(1.005, 6)
  })

  it('counts every source of decision, the ban cache and the anonymous limiter included', () => {
    const m = measurement(1, autocannonResult(20_000), usage({ 'decisions from store': 10_100, 'decisions from anonymous': 10_000, 'store errors': 7 }))
    expect(m.redisCommandsPerRequest).toBe(1)
  })
})
