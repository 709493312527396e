import type { Cluster, Redis } from 'ioredis'
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible'
import { coalesceWritesPerTurn, withinBudget } from './redisStore.ts'

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
 */
export function createAnonymousLimiter(options: {
  perMinute: number
  windowSeconds: number
  redis?: Redis | Cluster
  /** The Redis time budget; past it the in-memory insurance limiter decides. */
  budgetMillis?: number
}) {
  const shape = { points: options.perMinute, duration: options.windowSeconds, keyPrefix: 'anon' }
  // This process's limiter: the only one without Redis, else the insurance, consulted here exactly
  // once for each request Redis could not decide (an error or the budget passing), never a second
  // time when a late command fails after all.
  const local = new RateLimiterMemory(shape)
  const shared = options.redis ? new RateLimiterRedis({ ...shape, storeClient: options.redis }) : undefined
  const coalesce = options.redis ? coalesceWritesPerTurn(options.redis) : () => undefined

  const decision = (result: RateLimiterRes, admitted: boolean): AnonymousDecision => ({
    admitted,
    limit: options.perMinute,
    remaining: Math.max(result.remainingPoints, 0),
    resetInMillis: Math.max(result.msBeforeNext, 0),
    windowSeconds: options.windowSeconds,
  })

  return {
    async consume(clientIp: string): Promise<AnonymousDecision> {
      try {
        if (!shared) return decision(await local.consume(clientIp), true)
        try {
          coalesce()
          const pending = shared.consume(clientIp)
          return decision(await (options.budgetMillis === undefined ? pending : withinBudget(pending, options.budgetMillis)), true)
        } catch (error) {
          if (error instanceof RateLimiterRes) throw error
          // Redis failed, or is slower than the budget: this process's limiter decides.
          return decision(await local.consume(clientIp), true)
        }
      } catch (rejection) {
        if (rejection instanceof RateLimiterRes) return decision(rejection, false)
        throw rejection
      }
    },
  }
}

export type AnonymousLimiter = ReturnType<typeof createAnonymousLimiter>
