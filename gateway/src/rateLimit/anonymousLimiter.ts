import type { Cluster, Redis } from 'ioredis'
import { LRUCache } from 'lru-cache'
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible'
import { RedisBudgetExceededError, budgetedSender } from './redisStore.ts'

export interface AnonymousDecision {
  admitted: boolean
  limit: number
  remaining: number
  /** ms until the client's window resets. */
  resetInMillis: number
  windowSeconds: number
}

/**
 * An address's window in this process: requests counted, when it resets (monotonic clock), keys
 * looked up for it after it had no room left (beginLookUp), and lookups under way.
 */
interface LocalWindow {
  count: number
  resetsAt: number
  lookups: number
  pending: number
  /** Lookups under way that went after waiting LOOKUP_WAIT_MILLIS for the others (beginLookUp `overdue`). */
  overdue: number
  /** Wakes the lookups waiting for one under way to settle (beginLookUp). */
  wake?: () => void
  settling?: Promise<void>
}

/**
 * Whether a key no cache holds may be looked up for an address now: go (and call `settled` with
 * the answer), wait until one of its lookups under way has its answer and ask again, not at all
 * (`refused`: the address has spent its limit), or not now (`busy`: its lookups are overdue, the
 * key cannot be checked while Postgres is this slow).
 */
export type LookUpTurn =
  | { kind: 'go'; settled: (found: boolean) => void }
  | { kind: 'wait'; untilSettled: Promise<void> }
  | { kind: 'refused' }
  | { kind: 'busy' }

/** An address's counts in this process, which a reload's new limiter carries over. */
export interface AnonymousCounts {
  here: LRUCache<string, LocalWindow>
  /** When a window Redis said is spent resets, by address. */
  spent: LRUCache<string, number>
  /** The limit those windows were spent under. */
  limit: number
}

/** rate-limiter-flexible's prefix for the per-IP counts in Redis. */
const ANONYMOUS_KEY_PREFIX = 'anon'

/** The Redis key (before redis.keyPrefix) of an address's per-IP count. */
export function anonymousKey(address: string): string {
  return `${ANONYMOUS_KEY_PREFIX}:${address}`
}

/**
 * Requests without a valid key are limited per client IP and never charged to any key, at two
 * levels with the same limit:
 *
 * - This process counts every such request per address, in memory: a missing key, one that fails
 *   the format or checksum check (DESIGN: refused without touching Postgres or Redis), a
 *   guess, a public route. Nothing else is needed for requests that can never succeed.
 * - A guess (a well-formed key that had to be looked up and turned out unknown, revoked or
 *   expired) is also counted in Redis with rate-limiter-flexible, shared by every gateway: this is
 *   what makes guessing keys slow however many gateways there are. While Redis fails or is slower
 *   than the budget, this process's count decides alone.
 *
 * The in-process counts are fixed windows in an LRU, so a flood from many addresses costs neither
 * heap nor CPU (rate-limiter-flexible's memory limiter keeps a timer per address). An address
 * that Redis says has spent its window is refused from memory until the window resets: a flood of
 * guesses past the limit costs no Redis call, the way a banned key's refusals cost none.
 */
export function createAnonymousLimiter(options: {
  perMinute: number
  windowSeconds: number
  redis?: Redis | Cluster
  /** The Redis time budget; past it this process's count decides. */
  budgetMillis?: number
  /** Addresses remembered (default 100,000); the least recently seen are forgotten first. */
  maxAddresses?: number
  /**
   * The counts of the limiter this one replaces (a reload changed the limit or the window): an
   * address keeps what it has spent, so a reload gives a key guesser no fresh allowance.
   */
  replacing?: AnonymousCounts
  /** Every Redis call for a guess (from `address`), for the store's metrics and the operator's log. */
  onStoreCall?: (seconds: number, result: 'ok' | 'timeout' | 'error', error: unknown, address: string) => void
}) {
  const { perMinute: limit, windowSeconds, budgetMillis } = options
  const windowMillis = windowSeconds * 1_000
  const maxAddresses = options.maxAddresses ?? 100_000
  // Client IP → its window in this process, on this process's monotonic clock.
  const here = options.replacing?.here ?? new LRUCache<string, LocalWindow>({ max: maxAddresses })
  // The counts every gateway shares, and how commands reach them (coalesced, within the budget).
  const shared = options.redis
    ? {
        limiter: new RateLimiterRedis({ points: limit, duration: windowSeconds, keyPrefix: ANONYMOUS_KEY_PREFIX, storeClient: options.redis }),
        send: budgetedSender(options.redis, budgetMillis),
      }
    : undefined
  // Client IP → when its spent window in Redis resets, on this process's monotonic clock. Spent
  // under a lower limit is no longer spent: such an address has the room a raised limit gives it
  // at once (Redis still holds what it spent, and says so at its next guess).
  const carried = options.replacing && options.replacing.limit < limit ? undefined : options.replacing?.spent
  const spent = carried ?? new LRUCache<string, number>({ max: maxAddresses })

  /**
   * The address's window in this process, a new one if it had none. One that has reset starts
   * again in place: its lookups still under way keep their places (pending, overdue) and give them
   * back to it when they settle. Replaced, the new window counted none of them, and an address
   * could have twice its lookups under way for as long as those of the last window took.
   */
  function windowHere(clientIp: string, now: number): LocalWindow {
    let window = here.get(clientIp)
    if (window === undefined) {
      window = { count: 0, resetsAt: now + windowMillis, lookups: 0, pending: 0, overdue: 0 }
      here.set(clientIp, window)
    } else if (window.resetsAt <= now) {
      window.count = 0
      window.lookups = 0
      window.resetsAt = now + windowMillis
    }
    return window
  }

  /** A request counts only if admitted: a refused one consumes nothing, so a raised limit's room is there at once. */
  function consumeHere(clientIp: string): AnonymousDecision {
    const now = performance.now()
    const window = windowHere(clientIp, now)
    // The window starts at the address's first request charged to it: one a lookup of a valid key
    // opened (it keeps the lookups' places) had run for as long as that key kept sending.
    if (window.count === 0 && window.lookups === 0) window.resetsAt = now + windowMillis
    const admitted = window.count < limit
    if (admitted) window.count++
    return { admitted, limit, remaining: Math.max(limit - window.count, 0), resetInMillis: window.resetsAt - now, windowSeconds }
  }

  const decision = (result: RateLimiterRes, admitted: boolean): AnonymousDecision => ({
    admitted,
    limit,
    remaining: Math.max(result.remainingPoints, 0),
    resetInMillis: Math.max(result.msBeforeNext, 0),
    windowSeconds,
  })

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

  /**
   * Whether a key sent from this address that no cache holds may be looked up in Postgres now.
   * Anyone can compute a key's checksum, and a flood of invented keys would otherwise cost a query
   * each, refused or not. While the address has room in this process's window, as many lookups
   * may be under way as it has room left: each may be a guess, and requests arriving together
   * (pipelined, on parallel connections) would otherwise all be looked up before the first is
   * charged. Past that, a request waits for one of them to have its answer, then asks again: a
   * guess takes its room, a real key gives it back (many real keys behind one address, a cold cache,
   * are looked up a few at a time, none refused). Once the address has no room left, in this
   * process's window or in the shared one Redis reported, `limit` more lookups are made until the
   * window resets (a real key from behind the same address, say a colleague's behind one NAT),
   * then none; one that finds a usable key gives its place back.
   *
   * A request that has waited its while (`overdue`: Postgres is slow, the lookups under way take
   * seconds) goes without waiting any longer, but at most `limit` such lookups are under way for
   * an address at once; past them the key cannot be checked now (`busy`). Uncounted, a flood of
   * invented keys would cost a query each exactly while Postgres is slowest.
   */
  function beginLookUp(clientIp: string, overdue = false): LookUpTurn {
    const window = windowHere(clientIp, performance.now())
    const spentHere = window.count >= limit || spentWindow(clientIp) !== undefined
    let late = false
    if (spentHere) {
      if (window.lookups >= limit) return REFUSED
      window.lookups++
    } else if (window.count + window.pending >= limit) {
      if (overdue) {
        if (window.overdue >= limit) return BUSY
        late = true
        window.overdue++
      } else {
        if (window.settling === undefined) window.settling = new Promise((resolve) => (window.wake = resolve))
        return { kind: 'wait', untilSettled: window.settling }
      }
    }
    window.pending++
    return {
      kind: 'go',
      settled: (found) => {
        window.pending--
        if (late) window.overdue--
        if (spentHere && found && window.lookups > 0) window.lookups--
        const wake = window.wake
        window.wake = window.settling = undefined
        // After this turn: the request that settled is charged first (the rate-limit stage).
        if (wake) setImmediate(wake)
      },
    }
  }

  /** The refusal an address would get now, with nothing charged; undefined while it has room. */
  function refusalFor(clientIp: string): AnonymousDecision | undefined {
    const found = here.peek(clientIp)
    const window = found !== undefined && found.resetsAt > performance.now() && found.count >= limit ? found : undefined
    const local = window && { admitted: false, limit, remaining: 0, resetInMillis: window.resetsAt - performance.now(), windowSeconds }
    const refused = shared ? spentWindow(clientIp) : undefined
    return local && refused ? tighter(local, refused) : (local ?? refused)
  }

  return {
    /** What a limiter replacing this one carries over. */
    counts: { here, spent, limit } as AnonymousCounts,
    /** The per-IP policy, for answers that charge nothing to it. */
    policy: { limit, windowSeconds },
    /** Any request without a valid key that made no lookup: counted in this process only, no I/O. */
    consumeHere,
    beginLookUp,
    refusalFor,
    /**
     * One count in Redis for `address` (no client's: the start-up check), nothing here; rejects as
     * Redis does. A window with no room left is Redis's answer too, not a failure.
     */
    async countShared(address: string): Promise<void> {
      if (!shared) return
      await shared.send(() => shared.limiter.consume(address)).catch((rejection: unknown) => {
        if (!(rejection instanceof RateLimiterRes)) throw rejection
      })
    },
    /** A guess: counted here and, unless this process or a spent shared window already refuses the address, in Redis. */
    async consumeGuess(clientIp: string): Promise<AnonymousDecision> {
      const local = consumeHere(clientIp)
      if (!shared) return local
      // Refused here or not, a window Redis said is spent keeps the address waiting until it resets:
      // a Retry-After from this process's count alone could send the client back too early.
      const refused = spentWindow(clientIp)
      if (refused) return tighter(local, refused)
      if (!local.admitted) return local
      const started = performance.now()
      try {
        const decided = tighter(local, await consumeShared(shared, clientIp))
        options.onStoreCall?.((performance.now() - started) / 1_000, 'ok', undefined, clientIp)
        return decided
      } catch (error) {
        // Redis failed, or is slower than the budget: this process's count decides.
        options.onStoreCall?.((performance.now() - started) / 1_000, error instanceof RedisBudgetExceededError ? 'timeout' : 'error', error, clientIp)
        return local
      }
    },
  }
}

/**
 * Both counts together. Refused if either refuses, and then the wait is until every count with
 * nothing left has reset: a client that waits only for the first would be refused by the other.
 * Admitted, the one with less left (on a tie, the one that resets last).
 */
function tighter(a: AnonymousDecision, b: AnonymousDecision): AnonymousDecision {
  if (!a.admitted || !b.admitted) {
    const spent = [a, b].filter((decision) => decision.remaining === 0 || !decision.admitted)
    return { ...a, admitted: false, remaining: 0, resetInMillis: Math.max(...spent.map((decision) => decision.resetInMillis)) }
  }
  if (a.remaining !== b.remaining) return a.remaining < b.remaining ? a : b
  return a.resetInMillis >= b.resetInMillis ? a : b
}

const REFUSED: LookUpTurn = { kind: 'refused' }
const BUSY: LookUpTurn = { kind: 'busy' }

export type AnonymousLimiter = ReturnType<typeof createAnonymousLimiter>
