import type { Logger } from 'pino'
import type { Limiter } from '../rateLimit/limiter.ts'
import type { KeyCache } from './keyCache.ts'
import type { KeyChange, KeyRepository } from './keyRepository.ts'

type UnbanRepository = Pick<KeyRepository, 'pendingUnbans' | 'markUnbanApplied'>

/**
 * Lifts bans in the rate-limit store and marks each unban applied, once the store has taken it.
 * An unban the store could not take (Redis unreachable), or that no gateway was running to take,
 * stays pending in the change log: every gateway tries the pending ones at start and every
 * `retryMillis`, so an operator's unban is never lost to an outage.
 */
export function createUnbanApplier(options: { repository: UnbanRepository; limiter: Limiter; logger: Logger; retryMillis?: number }) {
  const { repository, limiter, logger } = options
  /** Pending unbans already reported as failing, so a long outage logs each once. */
  const reported = new Set<number>()
  let stopped = false

  /** `late`: a pending unban, retried after its change was first seen. */
  async function apply(change: KeyChange, late = false): Promise<void> {
    limiter.bans.forget(change.keyId)
    try {
      await limiter.store.unban(change.keyId)
    } catch (error) {
      if (!reported.has(change.id)) {
        reported.add(change.id)
        logger.error({ err: error, keyId: change.keyId }, 'unban not applied yet: the rate-limit store failed; retrying')
      }
      return
    }
    reported.delete(change.id)
    logger.info({ keyId: change.keyId }, 'API key unbanned')
    await repository.markUnbanApplied(change.id, late).catch((error: unknown) => {
      // The ban is lifted; the mark only spares other gateways a repeat.
      logger.warn({ err: error, keyId: change.keyId }, 'could not mark the unban applied')
    })
  }

  async function applyPending(): Promise<void> {
    try {
      for (const change of await repository.pendingUnbans()) await apply(change, true)
    } catch (error) {
      logger.warn({ err: error }, 'reading pending unbans failed; trying again shortly')
    }
  }

  let timer: NodeJS.Timeout | undefined
  const schedule = () => {
    if (stopped) return
    timer = setTimeout(() => void applyPending().finally(schedule), options.retryMillis ?? 2_000)
    timer.unref()
  }

  return {
    apply,
    /** Applies what is pending now, then keeps retrying in the background. */
    async start(): Promise<void> {
      await applyPending()
      schedule()
    },
    stop(): void {
      stopped = true
      clearTimeout(timer)
    },
  }
}

/**
 * What a gateway does with one entry of the key change log: forget the cached key, and for an
 * operator's unban, lift the ban in the local ban cache and in the rate-limit store.
 */
export function keyChangeHandler(keys: KeyCache, unbans: { apply(change: KeyChange, late?: boolean): Promise<void> }): (change: KeyChange) => void {
  return (change) => {
    keys.invalidate(change.keyHash)
    if (change.kind === 'unban') void unbans.apply(change)
  }
}
