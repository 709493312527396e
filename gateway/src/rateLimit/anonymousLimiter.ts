import type { Cluster, Redis } from 'ioredis'
import { LRUCache } from 'lru-cache'
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible'
import { budgetedSender } from './redisStore.ts'

export interface AnonymousDecision {
  admitted: boolean
  limit: number
  remaining: number
  /** ms until the client's window resets. */
  resetInMillis: number
  windowSeconds: number
}

/**
 * Requests without a valid key are limited per client IP and never charged to any key: this
 * is what makes guessing keys slow. rate-limiter-flexible keeps the counts in Redis (shared by
 * all gateways) with an in-memory insurance limiter that takes over while Redis fails.
 *
 * An address that Redis says has spent its window is then refused from memory until the window
 * resets: a flood of guesses past the limit costs no Redis call, the way a banned key's refusals
 * cost none, and Redis would refuse each of them until then anyway. rate-limiter-flexible's own
 * inMemoryBlockOnConsumed does the same with an unbounded map swept in full on every insert past
 * 1,000 entries; this one is an LRU, so a flood from many addresses costs neither heap nor CPU.
 */
export function createAnonymousLimiter(options: {
  perMinute: number
  windowSeconds: number
  redis?: Redis | Cluster
  /** The Redis time budget; past it the in-memory insurance limiter decides. */
  budgetMillis?: number
  /** Addresses remembered as spent (default 100,000); the least recently refused are forgotten first. */
  maxSpentAddresses?: number
}) {
  const { perMinute: limit, windowSeconds, budgetMillis } = options
  const shape = { points: limit, duration: windowSeconds, keyPrefix: 'anon' }
  // This process's limiter: the only one without Redis, else the insurance, consulted here exactly
  // once for each request Redis could not decide (an error or the budget passing), never a second
  // time when a late command fails after all.
  const local = new RateLimiterMemory(shape)
  // The counts every gateway shares, and how commands reach them (coalesced, within the budget).
  const shared = options.redis
    ? { limiter: new RateLimiterRedis({ ...shape, storeClient: options.redis }), send: budgetedSender(options.redis, budgetMillis) }
    : undefined
  // Client IP → when its spent window resets, on this process's monotonic clock.
  const spent = new LRUCache<string, number>({ max: options.maxSpentAddresses ?? 100_000 })

  const decision = (result: RateLimiterRes, admitted: boolean): AnonymousDecision => ({
    admitted,
    limit,
    remaining: Math.max(result.remainingPoints, 0),
    resetInMillis: Math.max(result.msBeforeNext, 0),
    windowSeconds,
  })

  async function consumeLocal(clientIp: string): Promise<AnonymousDecision> {
    try {
      return decision(await local.consume(clientIp), true)
    } catch (rejection) {
      if (rejection instanceof RateLimiterRes) return decision(rejection, false)
      throw rejection
    }
  }

  /** Redis's decision; rejects when Redis fails or is slower than the budget. */
  async function consumeShared({ limiter, send }: NonNullable<typeof shared>, clientIp: string): Promise<AnonymousDecision> {
    let result: AnonymousDecision
    try {
      result = decision(await send(() => limiter.consume(clientIp)), true)
    } catch (rejection) {
      if (!(rejection instanceof RateLimiterRes)) throw rejection
      result = decision(rejection, false)
    }
    if (result.remaining === 0) spent.set(clientIp, performance.now() + result.resetInMillis)
    return result
  }

  function spentWindow(clientIp: string): AnonymousDecision | undefined {
    const resetsAt = spent.get(clientIp)
    if (resetsAt === undefined) return undefined
    const resetInMillis = resetsAt - performance.now()
    if (resetInMillis > 0) return { admitted: false, limit, remaining: 0, resetInMillis, windowSeconds }
    spent.delete(clientIp)
    return undefined
  }

  return {
    async consume(clientIp: string): Promise<AnonymousDecision> {
      if (!shared) return consumeLocal(clientIp)
      const refused = spentWindow(clientIp)
      if (refused) return refused
      // Redis failed, or is slower than the budget: this process's limiter decides.
      return consumeShared(shared, clientIp).catch(() => consumeLocal(clientIp))
    },
  }
}

export type AnonymousLimiter = ReturnType<typeof createAnonymousLimiter>
