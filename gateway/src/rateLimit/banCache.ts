import { LRUCache } from 'lru-cache'

/**
 * Bans this gateway has seen, answered without a Redis call while they last. Expiry is kept
 * on the local clock as "now + time left by the store's clock", so a gateway whose clock is
 * skewed still holds a ban exactly as long as Redis does.
 */
export function createBanCache(options: { maxEntries?: number; clock?: () => number } = {}) {
  const clock = options.clock ?? (() => performance.now())
  const bans = new LRUCache<string, { until: number; step: number }>({ max: options.maxEntries ?? 100_000 })
  return {
    remember(keyId: string, millisLeft: number, step: number): void {
      bans.set(keyId, { until: clock() + millisLeft, step })
    },
    /** Milliseconds left of a known ban, or undefined. */
    lookup(keyId: string): { millisLeft: number; step: number } | undefined {
      const ban = bans.get(keyId)
      if (!ban) return undefined
      const millisLeft = ban.until - clock()
      if (millisLeft <= 0) {
        bans.delete(keyId)
        return undefined
      }
      return { millisLeft, step: ban.step }
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
