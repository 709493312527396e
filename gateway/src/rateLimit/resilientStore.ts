import type { Logger } from 'pino'
import type { LimitDecision, LimitRequest, LimitStore } from './limitStore.ts'

export class StoreUnavailableError extends Error {
  constructor(cause: unknown) {
    super('rate-limit store unavailable', { cause })
    this.name = 'StoreUnavailableError'
  }
}

export interface ResilientStoreOptions {
  primary: LimitStore
  /** Per-process limits used while the primary fails (onStoreFailure: open). */
  fallback: LimitStore | undefined
  logger: Logger
  /** After consecutive failures, skip the primary for this long instead of paying its timeout on every request. */
  retryAfterFailureMillis?: number
  /** Failures in a row that set the primary aside; one late reply on a busy machine is not an outage. */
  failuresBeforePause?: number
  onFailure?: (error: unknown) => void
  clock?: () => number
}

export type ResilientDecision = LimitDecision & { degraded: boolean }

/**
 * onStoreFailure in one place. Open: a failed or slow primary is replaced by per-process limits
 * (headers still present) for that request; after a few failures in a row the primary is set
 * aside for a moment, then probed again. Closed: StoreUnavailableError, which the
 * rate-limit stage answers 503. Recovery is automatic either way.
 */
export function createResilientStore(options: ResilientStoreOptions) {
  const clock = options.clock ?? Date.now
  const pause = options.retryAfterFailureMillis ?? 1_000
  const failuresBeforePause = options.failuresBeforePause ?? 3
  let skipUntil = 0
  let failing = false
  let failuresInARow = 0

  async function fallbackOr(error: unknown, request: LimitRequest): Promise<ResilientDecision> {
    if (!options.fallback) throw new StoreUnavailableError(error)
    return { ...(await options.fallback.consume({ ...request, nowMillis: undefined })), degraded: true }
  }

  return {
    async consume(request: LimitRequest): Promise<ResilientDecision> {
      if (clock() < skipUntil) return fallbackOr(new Error('primary paused after a failure'), request)
      try {
        const decision = await options.primary.consume(request)
        failuresInARow = 0
        if (failing) {
          failing = false
          options.logger.info({ store: options.primary.kind }, 'rate-limit store recovered')
        }
        return { ...decision, degraded: false }
      } catch (error) {
        if (++failuresInARow >= failuresBeforePause) skipUntil = clock() + pause
        options.onFailure?.(error)
        if (!failing) {
          failing = true
          options.logger.error({ err: error, store: options.primary.kind }, 'rate-limit store failing')
        }
        return fallbackOr(error, request)
      }
    },
    async unban(keyId: string): Promise<void> {
      await Promise.allSettled([options.primary.unban(keyId), options.fallback?.unban(keyId)])
    },
    async close(): Promise<void> {
      await Promise.allSettled([options.primary.close(), options.fallback?.close()])
    },
  }
}

export type ResilientStore = ReturnType<typeof createResilientStore>
