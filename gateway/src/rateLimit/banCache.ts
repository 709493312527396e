import { LRUCache } from 'lru-cache'
import type { WindowState } from './limitStore.ts'
import { sameKeyLimits, type KeyLimits } from './planLimits.ts'

/** Taken before a store call: a ban that call reports is kept only if the key was not forgotten since. */
export type BanTicket = number

/** What the store said of a ban (a LimitDecision's fields): its time, what is left, its step, the windows. */
export interface BanSeen {
  nowMillis: number
  banMillisLeft: number
  retryAfterMillis: number
  banStep: number
  minute: WindowState
  day: WindowState
}

/**
 * The window a banned key's X-RateLimit-* name (0 minute, 1 day): the day when it is the one spent,
 * else the minute, whose strikes bring bans on. Not the window nearest exhaustion as the store
 * sees it now: during a ban the minute frees (banned requests count in neither), so that moved
 * from the minute to the day mid-ban, and a gateway answering from its cache named the other.
 */
export function bannedWindow(windows: { day: WindowState }): number {
  return windows.day.remaining <= 0 ? 1 : 0
}

/**
 * Bans this gateway has seen, answered without a Redis call while they last. Expiry is kept
 * on the local clock as "now + time left by the store's clock", so a gateway whose clock is
 * skewed still holds a ban exactly as long as Redis does. Each ban also keeps the moment a
 * request would be admitted again, which can be later than its end (a window still full), and
 * the limits that moment was computed under: once the key's limits change (a reload, a new plan
 * or custom limits), the next request asks the store again rather than trust a stale moment.
 * That moment is kept in the store's time as well, as the store gave it, for X-RateLimit-Reset:
 * carried on the local clock it came back a reply's latency later, and a moment on a whole second
 * (a bucket's edge) was then given as the second after, unlike the gateways that asked the store.
 */
export function createBanCache(options: { maxEntries?: number; clock?: () => number } = {}) {
  const clock = options.clock ?? (() => performance.now())
  const bans = new LRUCache<string, { until: number; admittedAt: number; admittedAtStoreMillis: number; step: number; window: number; limits: KeyLimits }>({
    max: options.maxEntries ?? 100_000,
  })
  // An unban forgets the key while requests may be on their way to the store, and the store can
  // answer them "banned" after the unban is done (they reached Redis before it): without this,
  // such an answer would cache the lifted ban again, for as long as the ban had left (up to a day).
  let forgets = 0
  const forgottenAt = new LRUCache<string, number>({ max: 10_000 })
  return {
    ticket: (): BanTicket => forgets,
    remember(keyId: string, ticket: BanTicket, limits: KeyLimits, ban: BanSeen): void {
      if ((forgottenAt.get(keyId) ?? -1) > ticket) return
      const now = clock()
      const untilAdmitted = Math.max(ban.retryAfterMillis, ban.banMillisLeft)
      bans.set(keyId, {
        until: now + ban.banMillisLeft,
        admittedAt: now + untilAdmitted,
        admittedAtStoreMillis: ban.nowMillis + untilAdmitted,
        step: ban.banStep,
        window: bannedWindow(ban),
        limits,
      })
    },
    /**
     * Milliseconds left of a known ban and until a request would be admitted under `limits`, that
     * moment in the store's time, and the window its answers name (bannedWindow); or undefined.
     */
    lookup(keyId: string, limits: KeyLimits): { millisLeft: number; retryAfterMillis: number; admittedAtStoreMillis: number; step: number; window: number } | undefined {
      const ban = bans.get(keyId)
      if (!ban) return undefined
      const now = clock()
      const millisLeft = ban.until - now
      if (millisLeft <= 0 || !sameKeyLimits(ban.limits, limits)) {
        bans.delete(keyId)
        return undefined
      }
      return { millisLeft, retryAfterMillis: ban.admittedAt - now, admittedAtStoreMillis: ban.admittedAtStoreMillis, step: ban.step, window: ban.window }
    },
    /** Drops the key's ban, and any ban a store call started before now reports for it. */
    forget(keyId: string): void {
      forgets++
      forgottenAt.set(keyId, forgets)
      bans.delete(keyId)
    },
    /** Drops every ban held: the store they came from is another now (a Redis restart), and is asked again. */
    clear(): void {
      bans.clear()
    },
    /** Bans not ended yet. Ended ones are dropped here: a key that stops calling never looks its ban up again. */
    get size(): number {
      const now = clock()
      const ended: string[] = []
      bans.forEach((ban, keyId) => ban.until <= now && ended.push(keyId))
      for (const keyId of ended) bans.delete(keyId)
      return bans.size
    },
  }
}

export type BanCache = ReturnType<typeof createBanCache>
