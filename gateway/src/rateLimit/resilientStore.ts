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
  clock?: () => number
  /**
   * What is wrong with the connection, said beside the failed call's error in the log lines: a
   * call refused while ioredis reconnects fails with its own words ("Stream isn't writeable and
   * enableOfflineQueue options is false"), which named neither Redis's state nor why.
   */
  connectionProblem?: (domain: string) => string | undefined
  /** The store's name in log lines, as the metrics' `store` label has it (`cluster` for a Redis Cluster); the primary's kind unless set. */
  storeName?: string
}

interface DomainHealth {
  skipUntil: number
  /** A failure was logged (warn) and no success since. */
  failing: boolean
  /** The outage was logged (error) and no success since. */
  setAside: boolean
  failuresInARow: number
  failuresCounted: number
  /** Forgotten (forgetDomainsWithoutKeys): what calls sent before then meet says nothing of the domain now. */
  retired?: boolean
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
  /**
   * Kept per failure domain (a Redis Cluster master, or the whole store): a dead master sets
   * aside only its own keys, and the others' successes neither hide its failure nor announce its
   * recovery.
   */
  const health = new Map<string, DomainHealth>()
  const healthOf = (domain: string) => {
    let known = health.get(domain)
    if (!known) health.set(domain, (known = { skipUntil: 0, failing: false, setAside: false, failuresInARow: 0, failuresCounted: 0 }))
    return known
  }
  /** Domains whose failure was logged and no success since. */
  let failingDomains = 0
  const where = (domain: string) => ({ store: options.storeName ?? options.primary.kind, ...(domain === options.primary.kind ? {} : { node: domain }) })

  /**
   * The primary's clock (Redis TIME) less this host's, as of its last decision. The store's time
   * (storeNow) is what every answer speaks: the fallback's decisions too, so a gateway whose clock
   * is off gives the X-RateLimit-Reset and ban ends the other gateways give while Redis is away,
   * as it does while Redis answers.
   */
  let primaryClockOffset = 0
  const storeNow = () => clock() + primaryClockOffset

  async function fallbackOr(error: unknown, request: LimitRequest): Promise<ResilientDecision> {
    if (!options.fallback) throw new StoreUnavailableError(error)
    return { ...(await options.fallback.consume({ ...request, nowMillis: storeNow() })), degraded: true }
  }

  /**
   * A Cluster master that failed and then lost its slots (its replica was promoted, a reshard
   * moved them) never answers a call again, so no success would end its failure: the log said it
   * was failing and never that it recovered, and its stale state would greet it, should it serve
   * slots again, with a recovery it had not had. Its keys are decided by their new master now.
   * Calls sent to it before the slot map changed still hold its state: whether they then succeed
   * (a redirect followed) or time out where they were sent, they neither log it again nor move
   * failingDomains away from the domains actually failing.
   */
  function forgetDomainsWithoutKeys() {
    for (const [domain, state] of health) {
      if (!state.failing || options.primary.holdsKeys?.(domain) !== false) continue
      state.retired = true
      health.delete(domain)
      failingDomains--
      options.logger.info({ ...where(domain), reason: 'its slots are served by another master (failover or reshard)' }, 'rate-limit store recovered')
    }
  }

  return {
    /** This host's reckoning of the store's time: its clock plus the offset seen on the primary's last decision. */
    now: storeNow,
    async consume(request: LimitRequest): Promise<ResilientDecision> {
      const domain = options.primary.failureDomain?.(request.keyId) ?? options.primary.kind
      const state = healthOf(domain)
      if (clock() < state.skipUntil) return fallbackOr(new Error('primary paused after a failure'), request)
      const countedBefore = state.failuresCounted
      try {
        const decision = await options.primary.consume(request)
        primaryClockOffset = decision.nowMillis - clock()
        if (state.retired) return { ...decision, degraded: false }
        // Answered by another master than the one it was sent to (a MOVED followed after a failover
        // or a reshard): the success is that master's, and says nothing of the failing one, which
        // may be dead. Its failure ends when its slots are known to be elsewhere, or it answers.
        if (state.failing && (options.primary.failureDomain?.(request.keyId) ?? domain) !== domain) {
          forgetDomainsWithoutKeys()
          return { ...decision, degraded: false }
        }
        state.failuresInARow = 0
        if (state.failing) {
          state.failing = false
          state.setAside = false
          failingDomains--
          options.logger.info(where(domain), 'rate-limit store recovered')
        }
        if (failingDomains > 0) forgetDomainsWithoutKeys()
        return { ...decision, degraded: false }
      } catch (error) {
        if (state.retired) return fallbackOr(error, request)
        // In a row means one after another: a failure counts only if none was counted while its
        // call was in flight, so the calls one stall fails together (a busy moment's late replies)
        // count once, and a stall that lasts is counted once per budget, three times in a row.
        if (state.failuresCounted === countedBefore) {
          state.failuresCounted++
          if (++state.failuresInARow >= failuresBeforePause) state.skipUntil = clock() + pause
        }
        // A late reply on a busy moment is a warning; a store failing often enough to be set aside
        // is the outage an operator is paged for, said once until it recovers.
        if (!state.failing) {
          state.failing = true
          failingDomains++
          options.logger.warn({ err: error, ...where(domain), problem: options.connectionProblem?.(domain) }, 'rate-limit store call failed')
        }
        if (!state.setAside && state.failuresInARow >= failuresBeforePause) {
          state.setAside = true
          options.logger.error({ err: error, ...where(domain), problem: options.connectionProblem?.(domain), setAsideMillis: pause }, 'rate-limit store failing')
        }
        return fallbackOr(error, request)
      }
    },
    /**
     * Lifts the ban in both stores, once per unban; fails when the primary could not take it (the
     * caller retries). False when the primary had applied this unban already.
     */
    async unban(keyId: string, changeId: number): Promise<boolean> {
      const [primary] = await Promise.allSettled([options.primary.unban(keyId, changeId), options.fallback?.unban(keyId, changeId, { nowMillis: storeNow() })])
      if (primary.status === 'rejected') throw primary.reason
      return primary.value
    },
    /** Lifts the ban in this process's fallback only: the shared store has lifted it already. */
    async unbanHere(keyId: string, changeId: number): Promise<void> {
      await options.fallback?.unban(keyId, changeId, { nowMillis: storeNow() })
    },
    async close(): Promise<void> {
      await Promise.allSettled([options.primary.close(), options.fallback?.close()])
    },
  }
}

export type ResilientStore = ReturnType<typeof createResilientStore>
