import type { Cluster, Redis } from 'ioredis'
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible'

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
export function createAnonymousLimiter(options: { perMinute: number; windowSeconds: number; redis?: Redis | Cluster }) {
  const shape = { points: options.perMinute, duration: options.windowSeconds, keyPrefix: 'anon' }
  const limiter = options.redis
    ? new RateLimiterRedis({ ...shape, storeClient: options.redis, insuranceLimiter: new RateLimiterMemory(shape) })
    : new RateLimiterMemory(shape)

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
        return decision(await limiter.consume(clientIp), true)
      } catch (rejection) {
        if (rejection instanceof RateLimiterRes) return decision(rejection, false)
        throw rejection
      }
    },
  }
}

export type AnonymousLimiter = ReturnType<typeof createAnonymousLimiter>
