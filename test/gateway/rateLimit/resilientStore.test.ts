import pino from 'pino'
import { describe, expect, it } from 'vitest'
import type { LimitRequest, LimitStore } from '../../../gateway/src/rateLimit/limitStore.ts'
import { createMemoryStore } from '../../../gateway/src/rateLimit/memoryStore.ts'
import { createResilientStore } from '../../../gateway/src/rateLimit/resilientStore.ts'
import { captureLog } from '../../helpers/logCapture.ts'

const request: LimitRequest = {
  keyId: 'key_resilient',
  minute: { limit: 1_000, windowMillis: 60_000, bucketMillis: 5_000 },
  day: { limit: 10_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
  bans: { strikes: 10, ladderMillis: [60_000], memoryMillis: 86_400_000 },
}

/** A real in-process store standing in for Redis, which fails (like a late or refused Redis) while told to. */
function primaryThatCanFail(clock?: () => number) {
  const inner = createMemoryStore({ clock })
  const state = { failing: false, calls: 0 }
  const store: LimitStore = {
    ...inner,
    async consume(input) {
      state.calls++
      if (state.failing) throw new Error('Redis did not answer within 50 ms')
      return inner.consume(input)
    },
  }
  return { store, state }
}

describe('onStoreFailure open: when Redis fails, requests are decided by per-process limits', () => {
  function setUp() {
    const primary = primaryThatCanFail()
    let now = 1_000_000
    const store = createResilientStore({
      primary: primary.store,
      fallback: createMemoryStore(),
      logger: pino({ level: 'silent' }),
      retryAfterFailureMillis: 1_000,
      clock: () => now,
    })
    return { store, primary: primary.state, advance: (millis: number) => (now += millis) }
  }

  it('decides in the store\'s time, learned from its last answer, on a host whose clock is 150 s behind: the reset is the one Redis would give', async () => {
    const primary = primaryThatCanFail(() => Date.now() + 150_000)
    const store = createResilientStore({ primary: primary.store, fallback: createMemoryStore(), logger: pino({ level: 'silent' }) })
    const fromStore = await store.consume(request)
    primary.state.failing = true
    const fromFallback = await store.consume(request)
    expect(fromFallback.degraded).toBe(true)
    // The same moment give or take the test's own pace, not 150 s earlier.
    expect(Math.abs(fromFallback.nowMillis - fromStore.nowMillis)).toBeLessThan(5_000)
    expect(Math.abs(fromFallback.minute.resetMillis - fromStore.minute.resetMillis)).toBeLessThan(5_000)
  })

  it('one late reply sends only that request to the fallback; the next one asks Redis again', async () => {
    const { store, primary } = setUp()
    primary.failing = true
    expect((await store.consume(request)).degraded).toBe(true)
    primary.failing = false
    expect((await store.consume(request)).degraded).toBe(false)
    expect(primary.calls).toBe(2)
  })

  it('failures with successes in between are not in a row: Redis is never set aside for them', async () => {
    const { store, primary } = setUp()
    for (let i = 0; i < 5; i++) {
      primary.failing = true
      expect((await store.consume(request)).degraded).toBe(true)
      primary.failing = false
      expect((await store.consume(request)).degraded).toBe(false)
    }
    expect(primary.calls).toBe(10)
  })

  it('three failures in a row set Redis aside for a second, then it is asked again and used', async () => {
    const { store, primary, advance } = setUp()
    primary.failing = true
    for (let i = 0; i < 3; i++) expect((await store.consume(request)).degraded).toBe(true)
    primary.failing = false
    expect((await store.consume(request)).degraded).toBe(true)
    expect(primary.calls).toBe(3)
    advance(1_001)
    expect((await store.consume(request)).degraded).toBe(false)
    expect(primary.calls).toBe(4)
  })
})

describe('onStoreFailure open: a stall that fails the calls in flight together', () => {
  it('counts as one failure, not one per call: Redis is asked again by the next request', async () => {
    let release = () => undefined as void
    const stalled = new Promise<void>((resolve) => (release = resolve))
    let calls = 0
    let stalling = true
    const inner = createMemoryStore()
    const primary: LimitStore = {
      ...inner,
      async consume(input) {
        calls++
        if (!stalling) return inner.consume(input)
        await stalled
        throw new Error('Redis did not answer within 50 ms')
      },
    }
    const store = createResilientStore({ primary, fallback: createMemoryStore(), logger: pino({ level: 'silent' }), clock: () => 1_000_000 })
    const together = Array.from({ length: 5 }, () => store.consume(request))
    release()
    expect((await Promise.all(together)).map((decision) => decision.degraded)).toEqual([true, true, true, true, true])
    stalling = false
    expect((await store.consume(request)).degraded).toBe(false)
    expect(calls).toBe(6)
  })
})

describe('what the log says when Redis fails', () => {
  it('a late reply now and then is a warning, not an error: the error is for a Redis failing enough to be set aside', async () => {
    const primary = primaryThatCanFail()
    const log = captureLog()
    const store = createResilientStore({ primary: primary.store, fallback: createMemoryStore(), logger: pino(log.stream), clock: () => 1_000_000 })
    for (let i = 0; i < 2; i++) {
      primary.state.failing = true
      await store.consume(request)
      primary.state.failing = false
      await store.consume(request)
    }
    expect(log.entries().map((entry) => [entry.level, entry.msg])).toEqual([
      [40, 'rate-limit store call failed'],
      [30, 'rate-limit store recovered'],
      [40, 'rate-limit store call failed'],
      [30, 'rate-limit store recovered'],
    ])

    primary.state.failing = true
    for (let i = 0; i < 5; i++) await store.consume(request)
    expect(log.entries().slice(4).map((entry) => [entry.level, entry.msg, entry.setAsideMillis])).toEqual([
      [40, 'rate-limit store call failed', undefined],
      [50, 'rate-limit store failing', 1_000],
    ])
  })
})

describe('the failure lines', () => {
  // A call refused while ioredis reconnects fails with ioredis's own words, "Stream isn't writeable
  // and enableOfflineQueue options is false", which said neither Redis's state nor why.
  it('say what is wrong with the connection beside the call\'s error', async () => {
    const primary = primaryThatCanFail()
    const log = captureLog()
    const store = createResilientStore({
      primary: primary.store,
      fallback: createMemoryStore(),
      logger: pino(log.stream),
      clock: () => 1_000_000,
      connectionProblem: () => 'Redis is not connected (reconnecting): connect ECONNREFUSED 127.0.0.1:6379',
    })
    primary.state.failing = true
    for (let i = 0; i < 3; i++) await store.consume(request)
    expect(log.entries().map((entry) => [entry.msg, entry.problem])).toEqual([
      ['rate-limit store call failed', 'Redis is not connected (reconnecting): connect ECONNREFUSED 127.0.0.1:6379'],
      ['rate-limit store failing', 'Redis is not connected (reconnecting): connect ECONNREFUSED 127.0.0.1:6379'],
    ])
  })
})

describe('onStoreFailure open: a Redis that stays later than the budget under steady traffic', () => {
  it('is set aside after three failures one after another, not asked by every request', async () => {
    // Each call waits until the test fails it; traffic is steady, so every batch of calls is sent
    // while the one before is still waiting, as ten requests in flight at any time would be.
    const waiting: (() => void)[][] = []
    let calls = 0
    const primary: LimitStore = {
      ...createMemoryStore(),
      consume() {
        calls++
        return new Promise((_resolve, reject) => waiting.at(-1)!.push(() => reject(new Error('Redis did not answer within 50 ms'))))
      },
    }
    const store = createResilientStore({ primary, fallback: createMemoryStore(), logger: pino({ level: 'silent' }) })
    const decisions: Promise<unknown>[] = []
    const sendBatch = () => {
      waiting.push([])
      for (let i = 0; i < 10; i++) decisions.push(store.consume(request))
    }
    const failOldestBatch = async () => {
      for (const fail of waiting.shift()!) fail()
      await new Promise((resolve) => setImmediate(resolve))
    }
    sendBatch()
    for (let batch = 0; batch < 5; batch++) {
      sendBatch()
      await failOldestBatch()
    }
    expect(calls).toBe(60)
    // The third failure in a row (batches 1, 3 and 5: the ones sent after a counted failure) set it aside.
    sendBatch()
    expect(calls).toBe(60)
    await failOldestBatch()
    await Promise.all(decisions)
  })
})

describe('Redis Cluster: one failed master sets aside only its own keys', () => {
  it('keys on healthy masters stay on Redis while a dead master\'s keys are paused, and each master logs its own failure and recovery', async () => {
    const inner = createMemoryStore()
    const dead = new Set(['10.0.0.3:6379'])
    let calls = 0
    const masterOf = (keyId: string) => (keyId.endsWith('_on_c') ? '10.0.0.3:6379' : '10.0.0.1:6379')
    const primary: LimitStore = {
      ...inner,
      failureDomain: masterOf,
      async consume(input) {
        calls++
        if (dead.has(masterOf(input.keyId))) throw new Error('Connection is closed.')
        return inner.consume(input)
      },
    }
    const log = captureLog()
    const store = createResilientStore({ primary, fallback: createMemoryStore(), logger: pino(log.stream), clock: () => 1_000_000 })
    const onA = { ...request, keyId: 'key_on_a' }
    const onC = { ...request, keyId: 'key_on_c' }

    for (let i = 0; i < 3; i++) {
      expect((await store.consume(onC)).degraded).toBe(true)
      // Successes elsewhere neither reset the dead master's count nor announce its recovery.
      expect((await store.consume(onA)).degraded).toBe(false)
    }
    const callsAfterPause = calls
    expect((await store.consume(onC)).degraded).toBe(true)
    expect(calls).toBe(callsAfterPause)
    expect((await store.consume(onA)).degraded).toBe(false)
    expect(calls).toBe(callsAfterPause + 1)

    const lines = log.entries().map((entry) => [entry.level, entry.msg, entry.node])
    expect(lines).toEqual([
      [40, 'rate-limit store call failed', '10.0.0.3:6379'],
      [50, 'rate-limit store failing', '10.0.0.3:6379'],
    ])
  })
})

describe('Redis Cluster: a failed master whose slots another master takes over', () => {
  it('is logged as recovered once it serves no slot, and starts afresh should it serve slots again', async () => {
    const inner = createMemoryStore()
    // The key's master as the client's slot map says, and the masters serving slots.
    let master = '10.0.0.3:6379'
    let owners = new Set(['10.0.0.1:6379', '10.0.0.3:6379'])
    let failing = true
    const primary: LimitStore = {
      ...inner,
      failureDomain: () => master,
      holdsKeys: (domain) => owners.has(domain),
      async consume(input) {
        if (failing) throw new Error('Connection is closed.')
        return inner.consume(input)
      },
    }
    const log = captureLog()
    let now = 1_000_000
    const store = createResilientStore({ primary, fallback: createMemoryStore(), logger: pino(log.stream), clock: () => now })
    for (let i = 0; i < 3; i++) expect((await store.consume(request)).degraded).toBe(true)

    // Its replica is promoted: the key's calls go to the new master and succeed.
    master = '10.0.0.4:6379'
    owners = new Set(['10.0.0.1:6379', '10.0.0.4:6379'])
    failing = false
    expect((await store.consume(request)).degraded).toBe(false)
    expect((await store.consume(request)).degraded).toBe(false)
    expect(log.entries().map((entry) => [entry.level, entry.msg, entry.node])).toEqual([
      [40, 'rate-limit store call failed', '10.0.0.3:6379'],
      [50, 'rate-limit store failing', '10.0.0.3:6379'],
      [30, 'rate-limit store recovered', '10.0.0.3:6379'],
    ])

    // Failed back later: the old master serves the key again, and a failure there is a new one.
    now += 60_000
    master = '10.0.0.3:6379'
    owners = new Set(['10.0.0.1:6379', '10.0.0.3:6379'])
    expect((await store.consume(request)).degraded).toBe(false)
    failing = true
    expect((await store.consume(request)).degraded).toBe(true)
    expect(log.entries().slice(3).map((entry) => [entry.level, entry.msg, entry.node])).toEqual([
      [40, 'rate-limit store call failed', '10.0.0.3:6379'],
    ])
  })
})

describe('Redis Cluster: a failed master whose slots move while calls to it are still in flight', () => {
  it('is logged as recovered once, whatever those calls then meet, and a later master that fails over is logged as recovered too', async () => {
    const inner = createMemoryStore()
    // Each key's master as the client's slot map says, and the masters serving slots.
    const masters = new Map([['key_on_a', '10.0.0.1:6379'], ['key_on_c', '10.0.0.3:6379']])
    let owners = new Set(['10.0.0.1:6379', '10.0.0.3:6379'])
    const dead = new Set(['10.0.0.3:6379'])
    // A call held by its master (a failover's write pause) until released: then it is redirected
    // to the new master (true) or fails where it was sent (false).
    let held: Promise<boolean> | undefined
    const primary: LimitStore = {
      ...inner,
      failureDomain: (keyId) => masters.get(keyId)!,
      holdsKeys: (domain) => owners.has(domain),
      async consume(input) {
        const master = masters.get(input.keyId)!
        const redirected = held ? await held : false
        if (!redirected && dead.has(master)) throw new Error('Redis did not answer within 50 ms')
        return inner.consume(input)
      },
    }
    const log = captureLog()
    const store = createResilientStore({ primary, fallback: createMemoryStore(), logger: pino(log.stream), clock: () => 1_000_000 })
    const onA = { ...request, keyId: 'key_on_a' }
    const onC = { ...request, keyId: 'key_on_c' }
    const holdOne = () => {
      let release!: (redirected: boolean) => void
      held = new Promise((resolve) => (release = resolve))
      const decision = store.consume(onC)
      held = undefined
      return { decision, release }
    }

    expect((await store.consume(onC)).degraded).toBe(true)
    // Two calls for C's key are sent to 10.0.0.3 and held there while its replica takes over.
    const redirected = holdOne()
    const timedOut = holdOne()
    masters.set('key_on_c', '10.0.0.4:6379')
    owners = new Set(['10.0.0.1:6379', '10.0.0.4:6379'])
    expect((await store.consume(onC)).degraded).toBe(false)
    redirected.release(true)
    expect((await redirected.decision).degraded).toBe(false)
    timedOut.release(false)
    expect((await timedOut.decision).degraded).toBe(true)
    expect((await store.consume(onC)).degraded).toBe(false)

    // Later 10.0.0.1 fails too, and its replica takes over.
    dead.add('10.0.0.1:6379')
    expect((await store.consume(onA)).degraded).toBe(true)
    masters.set('key_on_a', '10.0.0.2:6379')
    owners = new Set(['10.0.0.2:6379', '10.0.0.4:6379'])
    expect((await store.consume(onA)).degraded).toBe(false)

    expect(log.entries().map((entry) => [entry.level, entry.msg, entry.node])).toEqual([
      [40, 'rate-limit store call failed', '10.0.0.3:6379'],
      [30, 'rate-limit store recovered', '10.0.0.3:6379'],
      [40, 'rate-limit store call failed', '10.0.0.1:6379'],
      [30, 'rate-limit store recovered', '10.0.0.1:6379'],
    ])
  })
})

describe('Redis Cluster: a dead master\'s call redirected to its promoted replica before the slot map is read again', () => {
  it('does not log the dead master as recovered: its line comes, with the reason, once the map no longer names it (store named as the metrics name it)', async () => {
    const inner = createMemoryStore()
    // The key's master as the client's slot map says it, and the masters the last full read of the map named.
    let master = '10.0.0.3:6379'
    let owners = new Set(['10.0.0.1:6379', '10.0.0.3:6379'])
    let promoted = false
    const primary: LimitStore = {
      ...inner,
      failureDomain: () => master,
      holdsKeys: (domain) => owners.has(domain),
      async consume(input) {
        if (master === '10.0.0.3:6379' && !promoted) throw new Error('Redis did not answer within 50 ms')
        // Sent to the dead master on the old map, answered MOVED by the promoted replica: the
        // client updates that one slot and follows it there, where the call succeeds.
        master = '10.0.0.4:6379'
        return inner.consume(input)
      },
    }
    const log = captureLog()
    const store = createResilientStore({ primary, fallback: createMemoryStore(), logger: pino(log.stream), clock: () => 1_000_000, storeName: 'cluster' })
    expect((await store.consume(request)).degraded).toBe(true)

    promoted = true
    expect((await store.consume(request)).degraded).toBe(false)
    expect(log.entries().map((entry) => [entry.level, entry.msg, entry.store, entry.node, entry.reason])).toEqual([
      [40, 'rate-limit store call failed', 'cluster', '10.0.0.3:6379', undefined],
    ])

    // The next read of the whole map names the promoted replica and not the dead master.
    owners = new Set(['10.0.0.1:6379', '10.0.0.4:6379'])
    expect((await store.consume(request)).degraded).toBe(false)
    expect(log.entries().slice(1).map((entry) => [entry.level, entry.msg, entry.store, entry.node, entry.reason])).toEqual([
      [30, 'rate-limit store recovered', 'cluster', '10.0.0.3:6379', 'its slots are served by another master (failover or reshard)'],
    ])
  })
})
