import { LRUCache } from 'lru-cache'

/**
 * Bans this gateway has seen, answered without a Redis call while they last. Expiry is kept
 * on the local clock as "now + time left by the store's clock", so a gateway whose clock is
 * skewed still holds a ban exactly as long as Redis does. Each ban also keeps the moment a
 * request would be admitted again, which can be later than its end (a window still full).
 */
export function createBanCache(options: { maxEntries?: number; clock?: () => number } = {}) {
  const clock = options.clock ?? (() => performance.now())
  const bans = new LRUCache<string, { until: number; admittedAt: number; step: number }>({ max: options.maxEntries ?? 100_000 })
  return {
    remember(keyId: string, millisLeft: number, retryAfterMillis: number, step: number): void {
      const now = clock()
      bans.set(keyId, { until: now + millisLeft, admittedAt: now + Math.max(retryAfterMillis, millisLeft), step })
    },
    /** Milliseconds left of a known ban and until a request would be admitted, or undefined. */
    lookup(keyId: string): { millisLeft: number; retryAfterMillis: number; step: number } | undefined {
      const ban = bans.get(keyId)
      if (!ban) return undefined
      const now = clock()
      const millisLeft = ban.until - now
      if (millisLeft <= 0) {
        bans.delete(keyId)
        return undefined
      }
      return { millisLeft, retryAfterMillis: ban.admittedAt - now, step: ban.step }
    },
    forget(keyId: string): void {
      bans.delete(keyId)
    },
    get size(): number {
      return bans.size
    },
  }
}

export type BanCache = ReturnType<typeof createBanCache>
