import type { Socket } from 'node:net'
import fc from 'fast-check'
import { Redis } from 'ioredis'
import { describe, expect, it } from 'vitest'
import { LATE_AFTER_MILLIS, connectRedis, createRedisStore, redisClockFor, redisReady } from '../../../gateway/src/rateLimit/redisStore.ts'
import { generateKeyId } from '../../../gateway/src/keys/apiKeyFormat.ts'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { createMemoryStore } from '../../../gateway/src/rateLimit/memoryStore.ts'
import { REDIS_BYTES_PER_KEY_BUDGET, bytesPerActiveKey } from '../../../gateway/src/rateLimit/redisFootprint.ts'
import { TEST_REDIS_URL, deleteKeysWithPrefix, testKeyPrefix } from '../../helpers/redis.ts'
import { describeLimitStore } from './store.suite.ts'

/** A client on the shared Redis under a key prefix of its own, an admin connection, and the prefix's keys deleted after. */
async function withPrefixedRedis(run: (redis: { client: ReturnType<typeof connectRedis>; admin: Redis; keyPrefix: string }) => Promise<void>) {
  const keyPrefix = testKeyPrefix()
  const client = connectRedis({ url: TEST_REDIS_URL, keyPrefix, commandTimeoutMillis: 1_000 })
  const admin = new Redis(TEST_REDIS_URL)
  try {
    if (!(await redisReady(client))) throw new Error('Redis did not become ready')
    await run({ client, admin, keyPrefix })
  } finally {
    client.disconnect()
    admin.disconnect()
    await deleteKeysWithPrefix(keyPrefix)
  }
}

describeLimitStore('single Redis', async () => {
  const keyPrefix = testKeyPrefix()
  const client = connectRedis({ url: TEST_REDIS_URL, keyPrefix, commandTimeoutMillis: 1_000 })
  if (!(await redisReady(client))) throw new Error('Redis did not become ready')
  const admin = new Redis(TEST_REDIS_URL)
  return {
    store: createRedisStore(client),
    async inspect(keyId) {
      const key = keyPrefix + limitKey(keyId)
      return { pttl: await admin.pttl(key), bytes: Number(await admin.memory('USAGE', key)) }
    },
    pttl: (key) => admin.pttl(keyPrefix + key),
    async close() {
      client.disconnect()
      admin.disconnect()
      await deleteKeysWithPrefix(keyPrefix)
    },
  }
})

describe('Redis writes', () => {
  it('sends the decisions of requests that arrive in one event-loop turn in one socket write, each answered on its own', async () => {
    await withPrefixedRedis(async ({ client }) => {
      const store = createRedisStore(client)
      const socket = (client as Redis).stream as Socket & { _write: Socket['_write']; _writev: NonNullable<Socket['_writev']> }
      let writes = 0
      const [write, writev] = [socket._write.bind(socket), socket._writev.bind(socket)]
      socket._write = (...args) => (writes++, write(...args))
      socket._writev = (...args) => (writes++, writev(...args))

      const keyId = `key_${Date.now()}`
      const minute = { limit: 30, windowMillis: 60_000, bucketMillis: 5_000 }
      const day = { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 }
      const bans = { strikes: 1_000, ladderMillis: [60_000], memoryMillis: 86_400_000 }
      const decisions = await Promise.all(Array.from({ length: 50 }, () => store.consume({ keyId, minute, day, bans })))

      expect(writes).toBe(1)
      expect(decisions.filter((decision) => decision.outcome === 'admitted')).toHaveLength(30)
      expect(decisions.filter((decision) => decision.outcome === 'limited')).toHaveLength(20)
      expect(decisions.map((decision) => decision.minute.remaining).sort((a, b) => b - a).slice(0, 30)).toEqual(
        Array.from({ length: 30 }, (_, i) => 29 - i),
      )
    })
  })
})

/**
 * A key's state as it is stored, written byte by byte: little-endian nM:u16 nD:u16,
 * minuteHead:f64 minute[nM]:u32, dayHead:f64 day[nD]:u32, strikes:u32 strikeStart:f64
 * banUntil:f64 level:u32 levelUntil:f64. Gateways of different versions share these keys during
 * a rolling upgrade, so the layout is a contract: a script that read it differently would drop
 * every count and ban on deploy.
 */
function storedState(state: { minute: number[]; minuteHead: number; day: number[]; dayHead: number; strikes: number; strikeStart: number; banUntil: number; level: number; levelUntil: number }): Buffer {
  const parts: Buffer[] = []
  const u16 = (n: number) => { const b = Buffer.alloc(2); b.writeUInt16LE(n); parts.push(b) }
  const u32 = (n: number) => { const b = Buffer.alloc(4); b.writeUInt32LE(n); parts.push(b) }
  const f64 = (n: number) => { const b = Buffer.alloc(8); b.writeDoubleLE(n); parts.push(b) }
  u16(state.minute.length)
  u16(state.day.length)
  f64(state.minuteHead)
  state.minute.forEach(u32)
  f64(state.dayHead)
  state.day.forEach(u32)
  u32(state.strikes)
  f64(state.strikeStart)
  f64(state.banUntil)
  u32(state.level)
  f64(state.levelUntil)
  return Buffer.concat(parts)
}

// The conformance suite checks each store against chosen cases; this checks them against each
// other on random histories mixing what those cases take one at a time: limits and window settings
// changing between requests (reloads, plan changes, gateways on either config), bans climbing and
// forgotten, unbans, and the store's clock stepping back.
describe('the in-process store and the Redis script', () => {
  it('agree on every decision of random histories of requests, reloads, bans, unbans and clock steps', async () => {
    const T0 = 1_800_000_000_000
    const shapes = [
      { minute: { limit: 3, windowMillis: 1_000, bucketMillis: 100 }, day: { limit: 8, windowMillis: 5_000, bucketMillis: 500 } },
      { minute: { limit: 2, windowMillis: 1_000, bucketMillis: 100 }, day: { limit: 8, windowMillis: 5_000, bucketMillis: 500 } },
      { minute: { limit: 3, windowMillis: 2_000, bucketMillis: 200 }, day: { limit: 8, windowMillis: 5_000, bucketMillis: 500 } },
      { minute: { limit: 3, windowMillis: 1_000, bucketMillis: 250 }, day: { limit: 5, windowMillis: 10_000, bucketMillis: 1_000 } },
    ]
    const banPolicies = [
      { strikes: 3, ladderMillis: [300, 1_000, 3_000], memoryMillis: 2_000 },
      { strikes: 2, ladderMillis: [200, 600], memoryMillis: 1_000 },
    ]
    await withPrefixedRedis(async ({ client }) => {
      const redis = createRedisStore(client)
      let changes = 0
      let histories = 0
      await fc.assert(
        fc.asyncProperty(
          fc.array(
            fc.record({
              // Mostly close together (windows fill, strikes ban), now and then a long pause or a clock step back.
              gap: fc.oneof({ arbitrary: fc.integer({ min: -50, max: 400 }), weight: 8 }, { arbitrary: fc.integer({ min: -12_000, max: 6_000 }), weight: 1 }),
              shape: fc.integer({ min: 0, max: shapes.length - 1 }),
              bans: fc.integer({ min: 0, max: banPolicies.length - 1 }),
              unban: fc.integer({ min: 0, max: 10 }).map((draw) => draw === 0),
            }),
            { minLength: 1, maxLength: 80, size: 'max' },
          ),
          async (history) => {
            const memory = createMemoryStore({ maxKeys: 4 })
            const keyId = `key_parity${histories++}`
            let now = T0
            for (const step of history) {
              now += step.gap
              const bans = banPolicies[step.bans]!
              if (step.unban) {
                const change = ++changes
                const at = { nowMillis: now, memoryMillis: bans.memoryMillis }
                expect(await redis.unban(keyId, change, at)).toBe(await memory.unban(keyId, change, at))
                continue
              }
              const request = { keyId, nowMillis: now, ...shapes[step.shape]!, bans }
              expect(await redis.consume(request)).toEqual(await memory.consume(request))
            }
          },
        ),
        // Unshrunk: shrinking a long history against Redis outlasts the test's time.
        { numRuns: 60, endOnFailure: true },
      )
    })
  })
})

describe('stored state', () => {
  it('honours counts, strikes and bans in the layout gateways wrote before bucket lengths were kept', async () => {
    await withPrefixedRedis(async ({ client, admin, keyPrefix }) => {
      const store = createRedisStore(client)
      const now = 1_800_000_000_000
      const minute = { limit: 60, windowMillis: 60_000, bucketMillis: 5_000 }
      const day = { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 }
      const bans = { strikes: 10, ladderMillis: [60_000, 300_000], memoryMillis: 86_400_000 }
      const minuteHead = Math.floor(now / 5_000)
      const dayHead = Math.floor(now / 3_600_000)
      // 40 requests in the current minute bucket, 500 in the current hour; 9 strikes so far.
      const minuteRing = Array.from({ length: 13 }, (_, i) => (i === (minuteHead % 13) ? 40 : 0))
      const dayRing = Array.from({ length: 25 }, (_, i) => (i === (dayHead % 25) ? 500 : 0))
      const counted = storedState({ minute: minuteRing, minuteHead, day: dayRing, dayHead, strikes: 9, strikeStart: now - 1_000, banUntil: 0, level: 1, levelUntil: now + 3_600_000 })
      await admin.set(keyPrefix + limitKey('counted'), counted, 'PX', 60_000)

      const admitted = await store.consume({ keyId: 'counted', nowMillis: now, minute, day, bans })
      expect(admitted).toMatchObject({ outcome: 'admitted', minute: { remaining: 19 }, day: { remaining: 499 } })
      // Rewritten in the current layout: the header, both rings, the strikes beside the minute's.
      expect(((await admin.getBuffer(keyPrefix + limitKey('counted'))) as Buffer).length).toBe(32 + 8 + 2 * 13 * 4 + 8 + 25 * 4)

      const banned = storedState({ minute: minuteRing, minuteHead, day: dayRing, dayHead, strikes: 0, strikeStart: 0, banUntil: now + 42_000, level: 1, levelUntil: now + 3_600_000 })
      await admin.set(keyPrefix + limitKey('banned'), banned, 'PX', 60_000)
      expect(await store.consume({ keyId: 'banned', nowMillis: now, minute, day, bans })).toMatchObject({ outcome: 'banned', banMillisLeft: 42_000, retryAfterMillis: 42_000 })

      // Level 1 within its memory: the 10th strike bans for the ladder's second step.
      const limited = storedState({ minute: minuteRing.map((n) => (n ? 60 : 0)), minuteHead, day: dayRing, dayHead, strikes: 9, strikeStart: now - 1_000, banUntil: 0, level: 1, levelUntil: now + 3_600_000 })
      await admin.set(keyPrefix + limitKey('striking'), limited, 'PX', 60_000)
      expect(await store.consume({ keyId: 'striking', nowMillis: now, minute, day, bans })).toMatchObject({ outcome: 'banned', banStep: 1, newBan: true, banMillisLeft: 300_000, retryAfterMillis: 300_000 })
    })
  })
})

describe('late commands', () => {
  it('a script Redis runs after its deadline changes nothing and answers "expired" with Redis\'s time', async () => {
    await withPrefixedRedis(async ({ client, admin, keyPrefix }) => {
      const key = limitKey('key_lateCommand')
      const args = [0, 5, 60_000, 5_000, 100, 86_400_000, 3_600_000, 10, 86_400_000, '60000'] as const
      const [redisSeconds] = await admin.time()
      const pastDeadline = Number(redisSeconds) * 1_000 - 1_000
      const late = await client.slidingWindow(key, ...args, pastDeadline)
      expect(late[0]).toBe(3)
      expect(Math.abs(late[1] - Number(redisSeconds) * 1_000)).toBeLessThan(5_000)
      expect(await admin.exists(keyPrefix + key)).toBe(0)

      const onTime = await client.slidingWindow(key, ...args, late[1] + 60_000)
      expect(onTime.slice(0, 1)).toEqual([0])
      expect(onTime[2]).toBe(4)
    })
  })

  // The deadline was reckoned from the call, but the command leaves at the end of the turn that
  // made it: a gateway whose turns took over 100 ms (a major GC, a starved CPU) saw a healthy
  // Redis answer "expired", and twice in a row that failed the request to onStoreFailure.
  it('a healthy Redis behind a gateway whose event-loop turns take 150 ms: no call expires, none fails', async () => {
    await withPrefixedRedis(async ({ client }) => {
      const busy = (millis: number) => {
        const until = performance.now() + millis
        while (performance.now() < until);
      }
      const outcomes: number[] = []
      const slidingWindow = client.slidingWindow.bind(client)
      // Each reply is read in a turn that then works for 150 ms: a retry would be made in one too.
      client.slidingWindow = ((...args: Parameters<typeof slidingWindow>) => {
        const reply = slidingWindow(...args)
        reply.then((answer) => {
          outcomes.push(answer[0])
          setImmediate(() => busy(150))
        }, () => undefined)
        return reply
      }) as typeof client.slidingWindow
      const store = createRedisStore(client, { budgetMillis: 50 })
      const request = () => ({
        keyId: generateKeyId(),
        minute: { limit: 1_000, windowMillis: 60_000, bucketMillis: 5_000 },
        day: { limit: 100_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
        bans: { strikes: 10, memoryMillis: 86_400_000, ladderMillis: [60_000] },
      })
      // Learns Redis's clock (calls carry no deadline before its first reply).
      await store.consume(request())
      await new Promise((resolve) => setTimeout(resolve, 200))
      const results: string[] = []
      for (let round = 0; round < 3; round++) {
        // Asked at the start of a 150 ms turn, sent at its end.
        const early = store.consume(request()).then(() => 'decided', (error: Error) => error.name)
        busy(150)
        results.push(await early)
        await new Promise((resolve) => setTimeout(resolve, 300))
      }
      expect(results).toEqual(['decided', 'decided', 'decided'])
      expect(outcomes.filter((outcome) => outcome === 3)).toEqual([])
    })
  })

  it('the deadline comes from the smallest clock offset seen, and an expired reply within the budget corrects it', () => {
    const clock = redisClockFor(50)
    expect(clock.deadline('redis', 1_000)).toBe(0)
    // Redis's clock is 10,000 ms ahead of this process's monotonic clock; replies bound it from above.
    clock.learn('redis', 1_000, 11_003, false)
    clock.learn('redis', 2_000, 12_001, false)
    clock.learn('redis', 3_000, 13_020, false)
    expect(clock.deadline('redis', 4_000)).toBe(4_000 + 10_001 + LATE_AFTER_MILLIS)
    // Another Cluster master has a clock of its own.
    expect(clock.deadline('10.0.0.2:6379', 4_000)).toBe(0)
    // Redis's clock stepped 5 s forward: a reply comes back expired, and the estimate follows it.
    clock.learn('redis', 5_000, 20_002, true)
    expect(clock.deadline('redis', 6_000)).toBe(6_000 + 15_002 + LATE_AFTER_MILLIS)
    // A budget longer than half the allowance widens it.
    const slow = redisClockFor(800)
    slow.learn('redis', 1_000, 11_000, false)
    expect(slow.deadline('redis', 2_000)).toBe(2_000 + 10_000 + 1_600)
  })
})

describe('Redis memory per active key', () => {
  // check-config refuses windows whose state would pass 400 bytes (redisFootprint.ts): its
  // estimate must never be below what Redis really reports.
  it.each([
    { prefixLength: 18, minute: 12, day: 24 },
    { prefixLength: 64, minute: 12, day: 24 },
    { prefixLength: 30, minute: 30, day: 24 },
    { prefixLength: 64, minute: 60, day: 60 },
  ])('MEMORY USAGE is at most the estimate check-config judges by (a $prefixLength-character key prefix, $minute and $day buckets)', async ({ prefixLength, minute, day }) => {
    const keyPrefix = testKeyPrefix().padEnd(prefixLength, 'p')
    const client = connectRedis({ url: TEST_REDIS_URL, keyPrefix, commandTimeoutMillis: 1_000 })
    const admin = new Redis(TEST_REDIS_URL)
    try {
      if (!(await redisReady(client))) throw new Error('Redis did not become ready')
      const keyId = generateKeyId()
      await createRedisStore(client).consume({
        keyId,
        minute: { limit: 100, windowMillis: minute * 1_000, bucketMillis: 1_000 },
        day: { limit: 1_000, windowMillis: day * 3_600_000, bucketMillis: 3_600_000 },
        bans: { strikes: 10, ladderMillis: [60_000], memoryMillis: 86_400_000 },
      })
      const measured = Number(await admin.memory('USAGE', keyPrefix + limitKey(keyId)))
      const estimate = bytesPerActiveKey(keyPrefix, minute, day)
      expect(measured).toBeLessThanOrEqual(estimate)
      expect(measured).toBeGreaterThan(estimate * 0.85)
    } finally {
      client.disconnect()
      admin.disconnect()
      await deleteKeysWithPrefix(keyPrefix)
    }
  })

  it('keeps the shipped windows within 400 bytes under the longest key prefix the config allows', () => {
    expect(bytesPerActiveKey('p'.repeat(64), 12, 24)).toBeLessThanOrEqual(REDIS_BYTES_PER_KEY_BUDGET)
  })
})
