import { LRUCache } from 'lru-cache'
import { hashApiKeyHex } from './apiKeyFormat.ts'
import type { ApiKeyRecord, KeyRepository } from './keyRepository.ts'

export interface KeyCacheOptions {
  /** Most keys held; memory stays bounded whatever the number of keys in use. */
  maxEntries: number
  /** Backstop for how long a looked-up key is trusted; change notifications usually act first. */
  ttlMillis: number
  /** How long "no such key" is remembered, so guessing cannot hammer Postgres. */
  negativeTtlMillis: number
}

const UNKNOWN = Symbol('unknown key')
type Entry = ApiKeyRecord | typeof UNKNOWN

export interface KeyCacheStats {
  hits: number
  misses: number
}

/**
 * API key lookups through an LRU cache keyed by the key's hash (the plaintext is never kept).
 * Concurrent misses for one key share a single Postgres query.
 */
export function createKeyCache(repository: Pick<KeyRepository, 'findByHash'>, options: KeyCacheOptions) {
  const stats: KeyCacheStats = { hits: 0, misses: 0 }
  const cache = new LRUCache<string, { entry: Entry }>({
    max: options.maxEntries,
    ttl: options.ttlMillis,
    fetchMethod: async (hashHex, _stale, { options: fetchOptions }) => {
      stats.misses++
      const record = await repository.findByHash(Buffer.from(hashHex, 'hex'))
      if (!record) fetchOptions.ttl = options.negativeTtlMillis
      return { entry: record ?? UNKNOWN }
    },
  })

  // A change notification for a key whose lookup is in flight aborts that lookup (its answer
  // may predate the change); asking again returns the state after the change.
  async function fetchFresh(hashHex: string, attempts = 3): Promise<{ entry: Entry } | undefined> {
    try {
      return await cache.fetch(hashHex)
    } catch (error) {
      const aborted = error instanceof Error && (error.name === 'AbortError' || error.message === 'deleted')
      if (!aborted || attempts <= 1) throw error
      return fetchFresh(hashHex, attempts - 1)
    }
  }

  /** What the cache holds for a key hash: its record, null for a known unknown key, undefined when not held. */
  function cached(hashHex: string): ApiKeyRecord | null | undefined {
    const held = cache.get(hashHex)
    if (!held) return undefined
    stats.hits++
    return held.entry === UNKNOWN ? null : held.entry
  }

  /** Asks Postgres (one query however many ask at once). Rejects when Postgres cannot answer. */
  async function fetch(hashHex: string): Promise<ApiKeyRecord | undefined> {
    const fetched = await fetchFresh(hashHex)
    return fetched === undefined || fetched.entry === UNKNOWN ? undefined : fetched.entry
  }

  return {
    cached,
    fetch,
    /** The key's record, or undefined when no such key exists. Rejects when Postgres cannot answer. */
    async lookup(key: string): Promise<ApiKeyRecord | undefined> {
      const hashHex = hashApiKeyHex(key)
      const held = cached(hashHex)
      return held === undefined ? fetch(hashHex) : (held ?? undefined)
    },
    invalidate(keyHash: Buffer): void {
      cache.delete(keyHash.toString('hex'))
    },
    clear(): void {
      cache.clear()
    },
    get size(): number {
      return cache.size
    },
    stats,
  }
}

export type KeyCache = ReturnType<typeof createKeyCache>
