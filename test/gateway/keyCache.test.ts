import { describe, expect, it } from 'vitest'
import { generateApiKey, hashApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyCache } from '../../gateway/src/keys/keyCache.ts'
import type { ApiKeyRecord } from '../../gateway/src/keys/keyRepository.ts'

function record(id: string, plan = 'free'): ApiKeyRecord {
  return { id, displayPrefix: 'aas_x', name: 'n', plan, perMinute: null, perDay: null, createdAt: new Date(), expiresAt: null, revokedAt: null }
}

/** A key table's rows by the hash the cache asks for; `set` stores one under its key's hash. */
function keyRows() {
  const rows = new Map<string, ApiKeyRecord>()
  return { rows, set: (key: string, row: ApiKeyRecord) => void rows.set(hashApiKey(key).toString('hex'), row) }
}

/** A key table in a Map, counting lookups: the cache's behaviour is what is under test here. */
function table() {
  const { rows, set } = keyRows()
  const calls = { count: 0 }
  return {
    calls,
    set,
    async findByHash(hash: Buffer) {
      calls.count++
      await new Promise((resolve) => setTimeout(resolve, 5))
      return rows.get(hash.toString('hex'))
    },
  }
}

const options = { maxEntries: 3, ttlMillis: 60_000, negativeTtlMillis: 60_000 }

describe('the key cache', () => {
  it('asks the table once per key, then answers from memory', async () => {
    const keys = table()
    const key = generateApiKey()
    keys.set(key, record('key_a'))
    const cache = createKeyCache(keys, options)
    expect((await cache.lookup(key))?.id).toBe('key_a')
    expect((await cache.lookup(key))?.id).toBe('key_a')
    expect(keys.calls.count).toBe(1)
    expect(cache.stats).toEqual({ hits: 1, misses: 1 })
  })

  it('shares one lookup among concurrent requests for the same new key', async () => {
    const keys = table()
    const cache = createKeyCache(keys, options)
    const key = generateApiKey()
    await Promise.all(Array.from({ length: 50 }, () => cache.lookup(key)))
    expect(keys.calls.count).toBe(1)
  })

  it('remembers unknown keys', async () => {
    const keys = table()
    const cache = createKeyCache(keys, options)
    const key = generateApiKey()
    expect(await cache.lookup(key)).toBeUndefined()
    expect(await cache.lookup(key)).toBeUndefined()
    expect(keys.calls.count).toBe(1)
  })

  it('asks again about an unknown key once negativeTtlMillis has passed, while a known key stays cached for ttlMillis', async () => {
    const keys = table()
    const cache = createKeyCache(keys, { maxEntries: 3, ttlMillis: 60_000, negativeTtlMillis: 50 })
    const known = generateApiKey()
    keys.set(known, record('key_a'))
    const guess = generateApiKey()
    await cache.lookup(known)
    expect(await cache.lookup(guess)).toBeUndefined()
    await new Promise((resolve) => setTimeout(resolve, 120))
    // Issued meanwhile (its announcement lost): found once the unknown entry has lapsed.
    keys.set(guess, record('key_b'))
    expect((await cache.lookup(guess))?.id).toBe('key_b')
    expect((await cache.lookup(known))?.id).toBe('key_a')
    expect(keys.calls.count).toBe(3)
  })

  it('holds at most maxEntries unknown keys, and as many known ones', async () => {
    const keys = table()
    const cache = createKeyCache(keys, options)
    for (let i = 0; i < 10; i++) {
      const key = generateApiKey()
      keys.set(key, record(`key_${i}`))
      await cache.lookup(key)
    }
    for (let i = 0; i < 10; i++) await cache.lookup(generateApiKey())
    expect(cache.size).toBe(6)
  })

  it('keeps the keys in use when a flood of unknown keys passes through', async () => {
    const keys = table()
    const cache = createKeyCache(keys, options)
    const used = generateApiKey()
    keys.set(used, record('key_used'))
    expect((await cache.lookup(used))?.id).toBe('key_used')
    for (let i = 0; i < 20; i++) expect(await cache.lookup(generateApiKey())).toBeUndefined()
    const before = keys.calls.count
    expect((await cache.lookup(used))?.id).toBe('key_used')
    expect(keys.calls.count).toBe(before)
  })

  it('reads a key again after its change is announced', async () => {
    const keys = table()
    const key = generateApiKey()
    const hash = hashApiKey(key)
    keys.set(key, record('key_a', 'free'))
    const cache = createKeyCache(keys, options)
    await cache.lookup(key)
    keys.set(key, record('key_a', 'pro'))
    cache.invalidate(hash)
    expect((await cache.lookup(key))?.plan).toBe('pro')
  })

  it('returns the state after a change that lands while a lookup is in flight', async () => {
    const keys = table()
    const key = generateApiKey()
    const hash = hashApiKey(key)
    keys.set(key, record('key_a', 'free'))
    const cache = createKeyCache(keys, options)
    const inFlight = cache.lookup(key)
    keys.set(key, record('key_a', 'pro'))
    cache.invalidate(hash)
    expect((await inFlight)?.plan).toBe('pro')
  })
})

describe('the key cache, with a table that answers as of when it was asked (as Postgres does)', () => {
  /** Each lookup reads the row when it is asked and answers once `release` is called. */
  function snapshotTable() {
    const { rows, set } = keyRows()
    const calls = { count: 0 }
    const waiting: Array<() => void> = []
    return {
      calls,
      set,
      release: () => waiting.splice(0).forEach((resolve) => resolve()),
      findByHash(hash: Buffer): Promise<ApiKeyRecord | undefined> {
        calls.count++
        const row = rows.get(hash.toString('hex'))
        return new Promise((resolve) => waiting.push(() => resolve(row)))
      },
    }
  }

  /** Releases the table's lookups until `pending` settles. */
  async function settle<T>(table: { release(): void }, pending: Promise<T>): Promise<T> {
    let done = false
    void pending.finally(() => (done = true)).catch(() => undefined)
    while (!done) {
      table.release()
      await new Promise((resolve) => setImmediate(resolve))
    }
    return pending
  }

  // A revocation that commits while a key's lookup is on its way: the lookup read the row before
  // it, and its answer must neither be given nor kept for the TTL (a revoked key admitted 60 s).
  it('neither answers nor keeps a row read before a change announced while its lookup was on its way', async () => {
    const keys = snapshotTable()
    const key = generateApiKey()
    const hash = hashApiKey(key)
    keys.set(key, record('key_a', 'free'))
    const cache = createKeyCache(keys, options)
    const inFlight = cache.lookup(key)
    keys.set(key, { ...record('key_a', 'free'), revokedAt: new Date() })
    cache.invalidate(hash)
    expect((await settle(keys, inFlight))?.revokedAt).toBeInstanceOf(Date)
    const asked = keys.calls.count
    expect((await settle(keys, cache.lookup(key)))?.revokedAt).toBeInstanceOf(Date)
    expect(keys.calls.count).toBe(asked)
  })

  it('admits a key created after it was looked up as unknown, once its creation is announced', async () => {
    const keys = snapshotTable()
    const key = generateApiKey()
    const hash = hashApiKey(key)
    const cache = createKeyCache(keys, options)
    expect(await settle(keys, cache.lookup(key))).toBeUndefined()
    keys.set(key, record('key_new'))
    cache.invalidate(hash)
    expect((await settle(keys, cache.lookup(key)))?.id).toBe('key_new')
  })

  // clear() runs when the change log went back (a restored database): a lookup on its way then
  // read the table from before, and its row must not be kept.
  it('neither answers nor keeps a row read before the cache was cleared while its lookup was on its way', async () => {
    const keys = snapshotTable()
    const key = generateApiKey()
    keys.set(key, record('key_a', 'free'))
    const cache = createKeyCache(keys, options)
    const inFlight = cache.lookup(key)
    keys.set(key, record('key_a', 'pro'))
    cache.clear()
    expect((await settle(keys, inFlight))?.plan).toBe('pro')
    const asked = keys.calls.count
    expect((await settle(keys, cache.lookup(key)))?.plan).toBe('pro')
    expect(keys.calls.count).toBe(asked)
  })

  it('counts an unknown key answered from memory as a hit', async () => {
    const keys = snapshotTable()
    const cache = createKeyCache(keys, options)
    const key = generateApiKey()
    await settle(keys, cache.lookup(key))
    await settle(keys, cache.lookup(key))
    expect(cache.stats).toEqual({ hits: 1, misses: 1 })
  })

  // A key changed again and again: three reads, then the last one is answered, and not kept.
  it('reads a key changed during every read three times, answers the third read and keeps none', async () => {
    let reads = 0
    const key = generateApiKey()
    const hash = hashApiKey(key)
    const cache = createKeyCache(
      {
        async findByHash() {
          reads++
          const row = record(`key_read${reads}`)
          // Announced once the lookup is under way, as the change feed does.
          await new Promise((resolve) => setImmediate(resolve))
          cache.invalidate(hash)
          return row
        },
      },
      options,
    )
    expect((await cache.lookup(key))?.id).toBe('key_read3')
    expect(reads).toBe(3)
    expect(cache.size).toBe(0)
  })
})

