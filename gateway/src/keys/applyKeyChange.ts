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
  let readFailureReported = false
  let stopped = false
  /** The unbans being applied now, so stop() can wait for them. */
  const running = new Set<Promise<void>>()

  function track(work: Promise<void>): Promise<void> {
    running.add(work)
    return work.finally(() => running.delete(work))
  }

  async function lift(change: KeyChange, late: boolean): Promise<void> {
    limiter.bans.forget(change.keyId)
    if (change.applied) {
      // Lifted in the shared store already: only what this process holds goes. Lifting it there
      // again would also lift a ban the key earned after the first lift.
      await limiter.store.unbanHere(change.keyId, change.id)
      return
    }
    // Every gateway reading the change unmarked gets here: the store lifts the ban for the first
    // only, so a later one (its Redis further away) cannot lift a ban the key earned meanwhile.
    let lifted: boolean
    try {
      lifted = await limiter.store.unban(change.keyId, change.id)
    } catch (error) {
      if (!reported.has(change.id)) {
        reported.add(change.id)
        logger.error({ err: error, keyId: change.keyId }, 'unban not applied yet: the rate-limit store failed; retrying')
      }
      return
    }
    // A request decided while the unban was on its way may have cached the ban again.
    limiter.bans.forget(change.keyId)
    reported.delete(change.id)
    // Said by the gateway that marks the unban applied, once: the one that lifted the ban may not
    // know it did (Redis ran its call after the call had failed, and its retry lifts nothing).
    const marked = await repository.markUnbanApplied(change.id, late).catch((error: unknown) => {
      // The ban is lifted; the mark only spares other gateways a repeat.
      logger.warn({ err: error, keyId: change.keyId }, 'could not mark the unban applied')
      return lifted
    })
    if (marked) logger.info({ keyId: change.keyId }, 'API key unbanned')
  }

  async function applyPending(): Promise<void> {
    let pending: KeyChange[]
    try {
      pending = await repository.pendingUnbans()
      readFailureReported = false
    } catch (error) {
      if (!readFailureReported) logger.warn({ err: error }, 'reading pending unbans failed; trying again every few seconds')
      readFailureReported = true
      return
    }
    const ids = new Set(pending.map((change) => change.id))
    for (const id of reported) if (!ids.has(id)) reported.delete(id)
    for (const change of pending) {
      if (stopped) return
      await lift(change, true)
    }
  }

  let timer: NodeJS.Timeout | undefined
  const schedule = (delayMillis: number) => {
    if (stopped) return
    timer = setTimeout(() => void track(applyPending()).finally(() => schedule(options.retryMillis ?? 2_000)), delayMillis)
    timer.unref()
  }

  return {
    /** An unban just read from the change log. */
    apply: (change: KeyChange): Promise<void> => track(lift(change, false)),
    /** Applies what is pending, in the background: now, then every `retryMillis`. */
    start(): void {
      schedule(0)
    },
    /** Stops retrying, and waits for the unbans being applied now. */
    async stop(): Promise<void> {
      stopped = true
      clearTimeout(timer)
      await Promise.allSettled([...running])
    },
  }
}

/**
 * What a gateway does with one entry of the key change log: forget the cached key, and for an
 * operator's unban, lift the ban in the local ban cache and in the rate-limit store.
 */
export function keyChangeHandler(keys: KeyCache, unbans: { apply(change: KeyChange): Promise<void> }): (change: KeyChange) => void {
  return (change) => {
    keys.invalidate(change.keyHash)
    if (change.kind === 'unban') void unbans.apply(change)
  }
}
