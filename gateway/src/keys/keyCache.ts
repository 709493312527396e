import { LRUCache } from 'lru-cache'
import { hashApiKeyHex } from './apiKeyFormat.ts'
import type { ApiKeyRecord, KeyRepository } from './keyRepository.ts'

export interface KeyCacheOptions {
  /** Most known keys held, and as many unknown ones: memory stays bounded whatever the number of keys in use. */
  maxEntries: number
  /** Backstop for how long a looked-up key is trusted; change notifications usually act first. */
  ttlMillis: number
  /** How long "no such key" is remembered, so guessing cannot hammer Postgres. */
  negativeTtlMillis: number
}

export interface KeyCacheStats {
  hits: number
  misses: number
}

/**
 * API key lookups through an LRU cache keyed by the key's hash (the plaintext is never kept).
 * Concurrent misses for one key share a single Postgres query. Unknown keys are remembered in an
 * LRU of their own, with the same bound, and a lookup takes no slot in either until it has its
 * answer: a flood of guesses can fill the unknown keys' cache, but cannot push the keys clients
 * really use out of theirs and send each of them back to Postgres.
 */
export function createKeyCache(repository: Pick<KeyRepository, 'findByHash'>, options: KeyCacheOptions) {
  const stats: KeyCacheStats = { hits: 0, misses: 0 }
  const known = new LRUCache<string, ApiKeyRecord>({ max: options.maxEntries, ttl: options.ttlMillis })
  const unknown = new LRUCache<string, true>({ max: options.maxEntries, ttl: options.negativeTtlMillis })
  /** Lookups under way, by key hash: one query however many requests ask. */
  const inFlight = new Map<string, Promise<ApiKeyRecord | undefined>>()
  /** Keys whose change was announced while their lookup was under way: its answer may predate the change. */
  const changedInFlight = new Set<string>()
  /**
   * Keys Postgres has found, kept after they leave `known` (its TTL, a change to the key): a new
   * lookup of one is no guess, whoever sends it, so the per-IP limit does not hold it up.
   */
  const found = new LRUCache<string, true>({ max: options.maxEntries })

  async function lookUp(hashHex: string): Promise<ApiKeyRecord | undefined> {
    for (let attempt = 1; ; attempt++) {
      stats.misses++
      const record = await repository.findByHash(Buffer.from(hashHex, 'hex'))
      // Asked again after a change, at most three times; a key changing faster is answered uncached.
      if (changedInFlight.delete(hashHex)) {
        if (attempt < 3) continue
        return record
      }
      if (record) {
        known.set(hashHex, record)
        found.set(hashHex, true)
      } else unknown.set(hashHex, true)
      return record
    }
  }

  /** What the cache holds for a key hash: its record, null for a known unknown key, undefined when not held. */
  function cached(hashHex: string): ApiKeyRecord | null | undefined {
    const record = known.get(hashHex)
    if (record !== undefined) {
      stats.hits++
      return record
    }
    if (unknown.get(hashHex) === undefined) return undefined
    stats.hits++
    return null
  }

  /** Asks Postgres (one query however many ask at once). Rejects when Postgres cannot answer. */
  function fetch(hashHex: string): Promise<ApiKeyRecord | undefined> {
    let pending = inFlight.get(hashHex)
    if (pending === undefined) {
      pending = lookUp(hashHex).finally(() => {
        inFlight.delete(hashHex)
        changedInFlight.delete(hashHex)
      })
      inFlight.set(hashHex, pending)
    }
    return pending
  }

  return {
    cached,
    fetch,
    /** Whether a lookup of this key hash is under way: a request for it joins that one query. */
    isLookingUp: (hashHex: string): boolean => inFlight.has(hashHex),
    /** Whether Postgres has found this key before (a key this gateway held, since dropped): looking it up again is no guess. */
    wasFound: (hashHex: string): boolean => found.has(hashHex),
    /** The key's record, or undefined when no such key exists. Rejects when Postgres cannot answer. */
    async lookup(key: string): Promise<ApiKeyRecord | undefined> {
      const hashHex = hashApiKeyHex(key)
      const held = cached(hashHex)
      return held === undefined ? fetch(hashHex) : (held ?? undefined)
    },
    invalidate(keyHash: Buffer): void {
      const hashHex = keyHash.toString('hex')
      known.delete(hashHex)
      unknown.delete(hashHex)
      if (inFlight.has(hashHex)) changedInFlight.add(hashHex)
    },
    /** Forgets every key, and has each lookup under way asked again (as invalidate does for one). */
    clear(): void {
      known.clear()
      unknown.clear()
      for (const hashHex of inFlight.keys()) changedInFlight.add(hashHex)
    },
    /** Keys held, known and unknown (each kind at most maxEntries). */
    get size(): number {
      return known.size + unknown.size
    },
    stats,
  }
}

export type KeyCache = ReturnType<typeof createKeyCache>
