import { setTimeout as sleep } from 'node:timers/promises'
import { describe, expect, it } from 'vitest'
import { createMemoryStore } from '../../../gateway/src/rateLimit/memoryStore.ts'
import { describeLimitStore } from './store.suite.ts'

describeLimitStore('in-process memory', async () => {
  const store = createMemoryStore()
  return { store, close: () => store.close() }
})

describe('in-process memory store, on the real clock', () => {
  // The conformance suite drives time through nowMillis; how long a key's state is kept runs on
  // the real clock, so it is checked here with windows short enough to pass during the test.
  it('remembers the ban ladder of a key idle past its ban and windows, so its next ban climbs a step', async () => {
    const store = createMemoryStore()
    const request = {
      keyId: 'key_idle',
      minute: { limit: 1, windowMillis: 200, bucketMillis: 100 },
      day: { limit: 1_000, windowMillis: 200, bucketMillis: 100 },
      bans: { strikes: 1, ladderMillis: [300, 5_000], memoryMillis: 10_000 },
    }
    expect((await store.consume(request)).outcome).toBe('admitted')
    const first = await store.consume(request)
    expect(first).toMatchObject({ outcome: 'banned', newBan: true, banStep: 0 })

    // Past the first ban and every window: only the ladder's memory is left of the key.
    await sleep(first.banMillisLeft + 2 * 300)
    expect((await store.consume(request)).outcome).toBe('admitted')
    const second = await store.consume(request)
    expect(second).toMatchObject({ outcome: 'banned', newBan: true, banStep: 1 })
    expect(second.retryAfterMillis).toBeGreaterThan(300)
    await store.close()
  })
})

describe('in-process memory store, full', () => {
  const request = (keyId: string, windowMillis: number) => ({
    keyId,
    minute: { limit: 10, windowMillis, bucketMillis: windowMillis / 2 },
    day: { limit: 100, windowMillis, bucketMillis: windowMillis / 2 },
    bans: { strikes: 5, ladderMillis: [300], memoryMillis: 0 },
  })

  it('says so when it pushes out a key whose windows still count, so that key goes unlimited', async () => {
    let full = 0
    const store = createMemoryStore({ maxKeys: 2, onFull: () => full++ })
    for (const keyId of ['a', 'b', 'c']) await store.consume(request(keyId, 60_000))
    expect(full).toBe(1)
    await store.close()
  })

  it('says nothing when what it pushes out had already expired: nothing in use was forgotten', async () => {
    let full = 0
    const store = createMemoryStore({ maxKeys: 2, onFull: () => full++ })
    for (const keyId of ['a', 'b']) await store.consume(request(keyId, 200))
    await sleep(600) // past both states' time-to-live
    await store.consume(request('c', 200))
    expect(full).toBe(0)
    await store.close()
  })
})

describe('the in-process store without Redis (npm start)', () => {
  // Its bound is on memory, not on the keys a deployment uses: with as many keys in use as the
  // key cache holds (config maxEntries: 10,000) and more, no key's count is forgotten, or a key
  // pushed out would get a fresh minute in the middle of its window.
  it('keeps counting every key with twenty thousand keys in use in the same minute', async () => {
    const store = createMemoryStore()
    const now = 1_800_000_000_000
    const plan = {
      minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 },
      day: { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
      bans: { strikes: 1_000_000, ladderMillis: [60_000], memoryMillis: 86_400_000 },
    }
    try {
      for (let i = 0; i < 20_000; i++) expect((await store.consume({ keyId: `key_${i}`, nowMillis: now, ...plan })).outcome).toBe('admitted')
      for (const i of [0, 1, 9_999, 19_999]) expect((await store.consume({ keyId: `key_${i}`, nowMillis: now + 1, ...plan })).outcome).toBe('limited')
    } finally {
      await store.close()
    }
  })
})
