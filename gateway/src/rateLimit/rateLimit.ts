import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from '../../../common/src/http/apiError.ts'
import { refuseFromHook } from '../../../common/src/http/errorHandler.ts'
import { spreadRetryAfterSeconds, type RetryAfterSpread } from '../../../common/src/http/retryAfter.ts'
import type { GatewayConfig } from '../config/loadConfig.ts'
import type { ApiKeyRecord } from '../keys/keyRepository.ts'
import { gatewayErrors } from '../errors.ts'
import type { AnonymousDecision, AnonymousLimiter } from './anonymousLimiter.ts'
import { bannedWindow, type BanCache } from './banCache.ts'
import { anonymousBucket } from './clientAddress.ts'
import type { NewBan } from './banJournal.ts'
import type { LimitDecision, LimitOutcome, LimitRequest } from './limitStore.ts'
import { banPolicy, cachedLimitsFor, type KeyLimits } from './planLimits.ts'
import { rateLimitHeaders, retryAfterSeconds, type NamedWindow } from './rateLimitHeaders.ts'
import { StoreUnavailableError, type ResilientStore } from './resilientStore.ts'

declare module 'fastify' {
  interface FastifyRequest {
    /** Rate-limit headers of this request's decision, written on whatever answer it gets. */
    rateLimitHeaders: Record<string, string> | null
    /** An admitted request's windows and the store's time of its decision: for an answer that comes late. */
    rateLimitAdmitted: { windows: NamedWindow[]; storeMillis: number } | null
  }
}

/**
 * An answer this much later than its decision (a slow upstream) gets its headers again: `RateLimit`
 * says seconds from now (`t`), and from the decision they overstated the wait by the answer's
 * latency (10 s for a 504), out of step with `X-RateLimit-Reset`. Below it, rounding `t` up to
 * whole seconds already covers the difference.
 */
const LATE_ANSWER_MILLIS = 1_000

export interface RateLimitEvent {
  /** The key's plan, or "anonymous" for the per-IP limit. */
  plan: string
  outcome: LimitOutcome | 'store_unavailable'
  /** Where the answer came from: the store, its per-process fallback, or the local ban cache. */
  source: 'store' | 'fallback' | 'ban_cache' | 'anonymous'
  /** Each window's limit and what is left after this request; absent for bans and failures. */
  windows?: { name: 'minute' | 'day'; limit: number; remaining: number }[]
}

export interface RateLimitObserver {
  decision(event: RateLimitEvent): void
  /** A ban a request started, at this ladder step (counted once, by the gateway that started it). */
  newBan(step: number): void
}

export interface RateLimitOptions {
  /** The live config (replaced atomically on reload). */
  config: () => GatewayConfig
  store: ResilientStore
  bans: BanCache
  anonymous: () => AnonymousLimiter
  observer?: RateLimitObserver
  /** Called once per ban, by the gateway whose request started it. */
  onNewBan?: (ban: NewBan) => void
}

/** The Retry-After of the 503 while the store cannot decide (onStoreFailure closed), drawn on each answer. */
const RETRY_AFTER_STORE_DOWN: RetryAfterSpread = { min: 1, max: 5 }

type WindowNow = { remaining: number; resetMillis: number }

// Module-level rather than per-request closures: this runs on every keyed request.
function keyWindows(limits: KeyLimits, minute: WindowNow, day: WindowNow): NamedWindow[] {
  return [
    { name: 'minute', limit: limits.minute.limit, windowSeconds: limits.minute.windowMillis / 1_000, ...minute },
    { name: 'day', limit: limits.day.limit, windowSeconds: limits.day.windowMillis / 1_000, ...day },
  ]
}

type Refusal = 'rate_limited' | 'api_key_banned'
/** Distinct Retry-After values kept per code: enough for the seconds a busy gateway refuses in, bounded whatever the ladder. */
const REFUSALS_KEPT = 1_024
const refusals: Record<Refusal, Map<string, ApiError>> = { rate_limited: new Map(), api_key_banned: new Map() }

/**
 * The 429 for a refusal, with Retry-After in whole seconds. Refusals differ only by that header,
 * and a client refused once usually sends more within the same second: one error per value, built
 * and serialised once, instead of one per request.
 */
function refusal(code: Refusal, retryAfterMillis: number): ApiError {
  const seconds = retryAfterSeconds(retryAfterMillis)
  const kept = refusals[code]
  let error = kept.get(seconds)
  if (error === undefined) {
    if (kept.size >= REFUSALS_KEPT) kept.clear()
    error = gatewayErrors.create(code, undefined, { headers: { 'retry-after': seconds } })
    kept.set(seconds, error)
  }
  return error
}

/** Ends the stage: on to the next one, a refusal answered (an ApiError), or a failure for Fastify's error path. */
function settle(reply: FastifyReply, done: (error?: Error) => void, outcome: unknown): void {
  if (outcome === undefined) done()
  else if (outcome instanceof ApiError) refuseFromHook(reply, done, outcome)
  else done(outcome as Error)
}

/**
 * A banned key has nothing left in either window until it would be admitted, wherever the answer
 * comes from: both spent until `admittedAtMillis` (store time). X-RateLimit-* name the window
 * `named` (bannedWindow): with both spent to one moment, the limit given flipped from the day's to
 * the minute's at a ban the day had caused.
 */
function bannedHeaders(limits: KeyLimits, now: number, admittedAtMillis: number, named: number): Record<string, string> {
  const end = { remaining: 0, resetMillis: admittedAtMillis }
  return rateLimitHeaders(keyWindows(limits, end, end), now, named)
}

/**
 * Stage 3: the limits. A key known to be banned is answered from the local ban cache; any
 * other key costs one store call (ban check, both windows, strikes). Requests without a valid
 * key are limited per client IP. Every answer, whatever its status, carries the headers.
 */
export const rateLimit = fp(
  async (app: FastifyInstance, options: RateLimitOptions) => {
    app.decorateRequest('rateLimitHeaders', null)
    app.decorateRequest('rateLimitAdmitted', null)

    // Headers speak the store's time (Redis TIME), whatever this host's clock says. Answers that
    // make no store call (a cached ban, the anonymous limit) use the offset seen on the last one.
    const storeNow = () => options.store.now()

    function anonymousHeaders(request: FastifyRequest, state: Omit<AnonymousDecision, 'admitted'>) {
      const now = storeNow()
      const { limit, remaining, resetInMillis, windowSeconds } = state
      request.rateLimitHeaders = rateLimitHeaders([{ name: 'anonymous', limit, remaining, resetMillis: now + resetInMillis, windowSeconds }], now)
    }

    /**
     * The per-IP limit for a request without a valid key: its headers, its metrics, and the 429
     * once the address has spent its window (undefined while it has not).
     */
    function anonymousOutcome(request: FastifyRequest, result: AnonymousDecision) {
      anonymousHeaders(request, result)
      options.observer?.decision({
        plan: 'anonymous',
        outcome: result.admitted ? 'admitted' : 'limited',
        source: 'anonymous',
        windows: [{ name: 'minute', limit: result.limit, remaining: result.remaining }],
      })
      if (result.admitted) return undefined
      return refusal('rate_limited', result.resetInMillis)
    }


    /** The refusal for a key the ban cache holds, or undefined: no store call, no promise. */
    function knownBanRefusal(request: FastifyRequest, key: ApiKeyRecord, limits: KeyLimits) {
      const knownBan = options.bans.lookup(key.id, limits)
      if (!knownBan) return undefined
      // The store's time now as this ban reckons it (its admission moment, less the wait left by
      // this host's clock): Reset is the moment Redis gave, and RateLimit's t says Retry-After.
      const { admittedAtStoreMillis, retryAfterMillis, window } = knownBan
      request.rateLimitHeaders = bannedHeaders(limits, admittedAtStoreMillis - retryAfterMillis, admittedAtStoreMillis, window)
      options.observer?.decision({ plan: key.plan, outcome: 'banned', source: 'ban_cache' })
      return refusal('api_key_banned', knownBan.retryAfterMillis)
    }

    /** The log line, the metric and the record (shared: for the keys CLI) of a ban a request started. */
    function announceBan(keyId: string, plan: string, decision: LimitDecision, shared: boolean, calledAt?: number) {
      options.observer?.newBan(decision.banStep)
      options.onNewBan?.({
        keyId,
        plan,
        step: decision.banStep,
        startedAtMillis: decision.nowMillis,
        endsAtMillis: decision.nowMillis + decision.banMillisLeft,
        shared,
        ...(calledAt === undefined ? {} : { calledAt }),
      })
    }

    /**
     * A ban Redis started on a reply that came after the budget: the request was answered per
     * onStoreFailure meanwhile, and without this the ban, in force on every gateway, would have no
     * log line, no count in gateway_bans_total and no record for `keys show`.
     */
    function announceLateBan(request: LimitRequest, decision: LimitDecision, calledAt: number) {
      if (decision.newBan) announceBan(request.keyId, request.plan ?? 'unknown', decision, true, calledAt)
    }

    async function limitKeyed(request: FastifyRequest, key: ApiKeyRecord, config: GatewayConfig, limits: KeyLimits) {

      const banTicket = options.bans.ticket()
      let decision
      try {
        decision = await options.store.consume({ keyId: key.id, plan: key.plan, ...limits, bans: banPolicy(config), onLateDecision: announceLateBan })
      } catch (error) {
        if (!(error instanceof StoreUnavailableError)) throw error
        // Nothing can be admitted until the store answers again: the 503 says so in the headers too.
        const now = storeNow()
        const retryAfter = spreadRetryAfterSeconds(RETRY_AFTER_STORE_DOWN)
        const closed = { remaining: 0, resetMillis: now + retryAfter * 1_000 }
        request.rateLimitHeaders = rateLimitHeaders(keyWindows(limits, closed, closed), now)
        options.observer?.decision({ plan: key.plan, outcome: 'store_unavailable', source: 'store' })
        throw gatewayErrors.create('service_unavailable', 'Rate limits cannot be checked right now; retry shortly.', {
          // No cause: the store's failure is logged once per outage (resilientStore.ts), not once per request.
          headers: { 'retry-after': String(retryAfter) },
        })
      }
      if (decision.outcome === 'banned') {
        request.rateLimitHeaders = bannedHeaders(limits, decision.nowMillis, decision.nowMillis + decision.retryAfterMillis, bannedWindow(decision))
      } else {
        const windows = keyWindows(limits, decision.minute, decision.day)
        request.rateLimitHeaders = rateLimitHeaders(windows, decision.nowMillis)
        if (decision.outcome === 'admitted') request.rateLimitAdmitted = { windows, storeMillis: decision.nowMillis }
      }
      options.observer?.decision({
        plan: key.plan,
        outcome: decision.outcome,
        source: decision.degraded ? 'fallback' : 'store',
        ...(decision.outcome === 'banned'
          ? {}
          : {
              windows: [
                { name: 'minute' as const, limit: decision.minute.limit, remaining: decision.minute.remaining },
                { name: 'day' as const, limit: decision.day.limit, remaining: decision.day.remaining },
              ],
            }),
      })
      if (decision.newBan) announceBan(key.id, key.plan, decision, !decision.degraded)
      if (decision.outcome === 'banned') {
        // A ban this process's fallback decided is not cached: each request asks the resilient
        // store, which answers it from the fallback while Redis is set aside, until Redis answers
        // again and decides as it does on every other gateway. Cached, it went on refusing the key
        // here alone, up to the ladder's longest step, while the others admitted it.
        if (!decision.degraded) options.bans.remember(key.id, banTicket, limits, decision)
        throw refusal('api_key_banned', decision.retryAfterMillis)
      }
      if (decision.outcome === 'limited') {
        throw refusal('rate_limited', decision.retryAfterMillis)
      }
    }

    // Callback style, so the hook adds no promise of its own to the store call's. A cached ban is
    // refused synchronously: an async function that throws before its first await hands back a
    // promise rejected before any handler is attached, and Node's unhandled-rejection bookkeeping
    // for it cost more than the rest of the refusal (banned row: 83 → 61 µs/req in the bench).
    app.addHook('onRequest', (request, reply, done) => {
      const key = request.apiKey
      if (!key) {
        // A key that could not be checked (Postgres unreachable) may well be a paying customer's:
        // it is answered 503 and charged to nobody, neither its IP's anonymous limit nor a key.
        // Its headers are the per-IP policy's, saying what the 503 says: nothing before Retry-After.
        const reason = request.authFailureReason
        if (reason === 'unchecked') {
          const retryAfterMillis = Number(request.authFailure?.headers['retry-after']) * 1_000
          anonymousHeaders(request, { ...options.anonymous().policy, remaining: 0, resetInMillis: retryAfterMillis })
          return done()
        }
        const client = anonymousBucket(request.ip)
        // A key not looked up because the address had spent its limit (authenticate.ts) is refused
        // like the guess it may be: valid or not, it was not checked. Should the window have freed
        // since, in between the two stages, the client is told to retry in a second.
        if (reason === 'over_ip_limit') {
          const limiter = options.anonymous()
          const refused = limiter.refusalFor(client) ?? { ...limiter.policy, admitted: false, remaining: 0, resetInMillis: 1_000 }
          return settle(reply, done, anonymousOutcome(request, refused))
        }
        // Only a guess (a well-formed key looked up in vain) is counted across gateways, in Redis;
        // a missing or malformed key, or a public route, is counted in this process, with no I/O.
        if (reason !== 'unknown' && reason !== 'revoked_or_expired') return settle(reply, done, anonymousOutcome(request, options.anonymous().consumeHere(client)))
        return void options.anonymous().consumeGuess(client).then((result) => settle(reply, done, anonymousOutcome(request, result)), done)
      }
      const config = options.config()
      const limits = cachedLimitsFor(key, config)
      const banned = knownBanRefusal(request, key, limits)
      if (banned) return settle(reply, done, banned)
      limitKeyed(request, key, config, limits).then(() => done(), (error: unknown) => settle(reply, done, error))
    })

    // Callback style: every answer passes here, and an async hook costs a promise each time.
    app.addHook('onSend', (request, reply, payload, done) => {
      const admitted = request.rateLimitAdmitted
      if (admitted !== null) {
        // In the store's time, as the decision's: one clock read, none at the decision.
        const late = storeNow() - admitted.storeMillis
        if (late >= LATE_ANSWER_MILLIS) request.rateLimitHeaders = rateLimitHeaders(admitted.windows, admitted.storeMillis + late)
      }
      if (request.rateLimitHeaders) reply.headers(request.rateLimitHeaders)
      done(null, payload)
    })
  },
  { name: 'rate-limit', dependencies: ['authenticate'] },
)
