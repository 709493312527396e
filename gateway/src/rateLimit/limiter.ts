import type { Logger } from 'pino'
import type { GatewayConfig } from '../config/loadConfig.ts'
import { anonymousKey, createAnonymousLimiter, type AnonymousLimiter } from './anonymousLimiter.ts'
import { createBanCache, type BanCache } from './banCache.ts'
import { createMemoryStore } from './memoryStore.ts'
import { limitKey, type LimitStore } from './limitStore.ts'
import { banPolicy, limitsFor } from './planLimits.ts'
import {
  RedisBudgetExceededError,
  clusterMastersLoggedIn,
  connectRedis,
  createRedisStore,
  oneNamePerMaster,
  redisConnectionProblem,
  redisFailureDomain,
  redisReady,
  redisRefusedOnConnect,
  redisRefusesCredentials,
  redisRefusesPermission,
  watchCredentialRefusals,
  type RedisClient,
} from './redisStore.ts'
import { evictingRedisServers, watchRedisRestarts } from './redisServerInfo.ts'
import { createResilientStore, type ResilientStore } from './resilientStore.ts'

export interface Limiter {
  store: ResilientStore
  bans: BanCache
  /** The per-IP limiter for the config in force (rebuilt when a reload changes its shape). */
  anonymous(): AnonymousLimiter
  /** Where limits live: a Redis server, a Redis Cluster, or this process. */
  storeKind: 'redis' | 'cluster' | 'memory'
  /**
   * Whether the store's connection is up (waits up to 2 s for it, and on a Cluster for every
   * master to take or refuse the credentials); the start-up check, once.
   */
  ready(): Promise<boolean>
  /** Why Redis has no usable connection, in the socket's words (ENOTFOUND, ECONNREFUSED); undefined when it has one. */
  connectionProblem(): string | undefined
  /** Redis's words (WRONGPASS, NOAUTH) when it refuses the gateway's credentials; undefined otherwise. */
  credentialsRefused(): string | undefined
  /**
   * For /readyz: one real decision on a probe key, through the same script, budget and write path
   * as a request's. Rejects with the reason when a request would get none: Redis disconnected,
   * frozen or slow past the budget, out of memory, or refusing the script.
   */
  probe(): Promise<void>
  /**
   * The start-up check of the ACL user's permissions, once Redis has taken the credentials:
   * Redis's words (NOPERM …) when it refuses the gateway a command or key that connecting, a
   * decision or a guess needs, on any master; undefined otherwise, including when the check fails
   * for another reason (Redis down or slow: that may mend).
   */
  permissionsRefused(): Promise<string | undefined>
  /** The Redis servers that evict keys when full, with their policies (evictingRedisServers); none for the in-process store. */
  evictingServers(): Promise<string[]>
  close(): Promise<void>
}

/** Not an id the keys table can hold (those are `key_…`); its one Redis key expires like any other. */
export const READINESS_PROBE_KEY_ID = 'readiness-probe'

/** Counted like a client's address by the start-up check; no client has it. */
const PERMISSION_PROBE_ADDRESS = 'permission-probe'

/** Every call to the primary store, for latency and error metrics. */
export interface StoreObserver {
  call(store: Limiter['storeKind'], seconds: number, result: 'ok' | 'timeout' | 'error'): void
}

export interface LimiterOptions {
  config: () => GatewayConfig
  logger: Logger
  observer?: StoreObserver
  /** Local monotonic clock for the ban cache (tests skew it). */
  clock?: () => number
}

/**
 * Builds the rate-limit machinery from config: Redis (or Cluster) when REDIS_URL or
 * REDIS_CLUSTER_NODES names one, with the per-process store as the onStoreFailure=open
 * fallback; else the in-process store alone, valid for a single gateway.
 */
export function createLimiter(options: LimiterOptions): Limiter {
  const boot = options.config()
  const { url, clusterNodes, commandTimeoutMillis, keyPrefix } = boot.redis
  const redis = url || clusterNodes?.length ? connectRedis(boot.redis) : undefined
  if (!redis) {
    options.logger.warn(
      'no REDIS_URL or REDIS_CLUSTER_NODES: rate limits are kept in this process, valid for a single gateway only',
    )
  }
  const storeKind: Limiter['storeKind'] = !redis ? 'memory' : clusterNodes?.length ? 'cluster' : 'redis'
  // From the start-up check on (ready()): a refusal before it stops the gateway (main.ts) instead.
  let started = false
  if (redis) reportCredentialRefusals(redis, storeKind, options.logger, () => started)
  const unobserved = redis ? createRedisStore(redis, { budgetMillis: commandTimeoutMillis }) : createMemoryStore()
  const refusals = redis
    ? permissionRefusalReporter(storeKind, keyPrefix ?? '', options.logger, {
        domainOf: (call, id) => redisFailureDomain(redis, call === 'decision' ? limitKey(id) : anonymousKey(id)),
        holdsKeys: unobserved.holdsKeys,
      })
    : undefined
  const primary = observed(unobserved, storeKind, options.observer, refusals)
  const store = createResilientStore({
    primary,
    // Bounded like the key cache: a long Redis outage with many keys cannot grow the heap past it.
    fallback: redis && boot.onStoreFailure === 'open' ? fallbackStore(boot.keyCache.maxEntries, options.logger) : undefined,
    logger: options.logger,
    connectionProblem: (domain) => (redis ? redisConnectionProblem(redis, domain) : undefined),
    storeName: storeKind,
  })
  const guessCalls = redis ? guessCallReporter(storeKind, options.observer, options.logger) : undefined
  const onGuessCall = guessCalls && ((seconds: number, result: 'ok' | 'timeout' | 'error', error: unknown, address: string) => {
    refusals?.(result === 'ok' ? undefined : (error ?? result), 'guess', address)
    guessCalls(seconds, result, error)
  })

  let anonymousShape = ''
  let anonymous: AnonymousLimiter | undefined
  /** A full decision for a probe key, never a strike; unobserved: probes are not requests, and would blur the store's metrics. */
  const probeDecision = (keyId: string) => {
    const config = options.config()
    return unobserved.consume({ keyId, ...limitsFor(PROBE_KEY, config), bans: banPolicy(config) })
  }
  const bans = createBanCache({ clock: options.clock })
  if (redis) {
    watchRedisRestarts(redis, () => {
      bans.clear()
      options.logger.info({ store: storeKind }, 'Redis is another server than before (restarted or failed over): the bans this gateway held are asked of it again')
    })
  }
  const limiter: Limiter = {
    store,
    bans,
    anonymous() {
      const config = options.config()
      const windowSeconds = Math.max(Math.round(config.windows.minute.lengthMillis / 1_000), 1)
      const shape = `${config.anonymous.perMinute}/${windowSeconds}`
      if (!anonymous || shape !== anonymousShape) {
        anonymous = createAnonymousLimiter({
          perMinute: config.anonymous.perMinute,
          windowSeconds,
          redis,
          budgetMillis: commandTimeoutMillis,
          replacing: anonymous?.counts,
          onStoreCall: onGuessCall,
        })
        anonymousShape = shape
      }
      return anonymous
    },
    storeKind,
    async ready() {
      const deadline = Date.now() + 2_000
      const ready = redis ? await redisReady(redis, 2_000) : true
      if (redis && ready) await clusterMastersLoggedIn(redis, Math.max(deadline - Date.now(), 0))
      started = true
      return ready
    },
    connectionProblem: () => (redis ? redisConnectionProblem(redis) : undefined),
    credentialsRefused: () => (redis ? redisRefusesCredentials(redis) : undefined),
    async probe() {
      // At once, not after a wait: the ops server gives a check 1 s, and a probe that outwaited it
      // would be reported as "no answer" instead of why (a refused connection, a DNS failure).
      const problem = redis && redisConnectionProblem(redis)
      if (problem) throw new Error(problem)
      try {
        await probeDecision(READINESS_PROBE_KEY_ID)
      } catch (error) {
        // The connection may have dropped while the probe was under way (or, on a Cluster, the one
        // to the probe key's master): then that is the reason.
        const dropped = redis && redisConnectionProblem(redis, redisFailureDomain(redis, limitKey(READINESS_PROBE_KEY_ID)))
        throw dropped ? new Error(dropped) : error
      }
    },
    async permissionsRefused() {
      if (!redis) return undefined
      // Refused while connecting: a database number (no +select), the slot map (no +cluster|slots).
      const problem = redisConnectionProblem(redis)
      const onConnect = redisRefusedOnConnect(redis) ?? (problem === undefined ? undefined : redisRefusesPermission(new Error(problem)))
      if (onConnect !== undefined || problem !== undefined) return onConnect
      const checks = [
        ...[...oneNamePerMaster(redis, (n) => `${READINESS_PROBE_KEY_ID}${n ? `-${n}` : ''}`, limitKey)].map(([master, keyId]) => ({ master, call: () => probeDecision(keyId) })),
        ...[...oneNamePerMaster(redis, (n) => `${PERMISSION_PROBE_ADDRESS}${n ? `-${n}` : ''}`, anonymousKey)].map(([master, address]) => ({ master, call: () => limiter.anonymous().countShared(address) })),
      ]
      const refused = await Promise.all(checks.map(async ({ master, call }) => {
        try {
          // Twice: ioredis sends a script's first call on each connection as EVAL, the next as EVALSHA.
          await call()
          await call()
          return undefined
        } catch (error) {
          const words = redisRefusesPermission(error)
          return words === undefined || storeKind !== 'cluster' ? words : `${master}: ${words}`
        }
      }))
      return refused.find((words) => words !== undefined)
    },
    evictingServers: async () => (redis ? evictingRedisServers(redis) : []),
    close: () => store.close(),
  }
  return limiter
}

/** What an operator grants when Redis refuses the gateway's user a command or key (README, Redis ACL). */
export function redisAclFix(kind: Limiter['storeKind'], keyPrefix: string): string {
  const commands = `+evalsha +eval +time +get +set +pttl +incrby +expire +info${kind === 'cluster' ? ' +cluster|slots +asking' : ''} (+select for a database number)`
  return `give the gateway's Redis user what the README's "Redis ACL" lists: keys ~${keyPrefix}rl:* ~${keyPrefix}anon:*, commands ${commands}${kind === 'cluster' ? ', on every node' : ''}`
}

/** The variables an operator fixes when Redis refuses the gateway's credentials. */
export function redisCredentialVariables(kind: Limiter['storeKind']): string {
  return kind === 'cluster' ? 'REDIS_CLUSTER_NODES with REDIS_PASSWORD (and REDIS_USERNAME)' : 'REDIS_URL (its password, or REDIS_PASSWORD)'
}

/**
 * A Redis that starts refusing the gateway's credentials while it runs (restarted with a new
 * password, its ACL user changed) is a misconfiguration no reconnect mends, unlike an outage:
 * said at error level once, not at every reconnect, and again only after Redis has accepted them
 * in between. Requests follow onStoreFailure meanwhile, as for any Redis failure, so it also
 * shows in gateway_rate_limit_store_errors_total and, with closed, in /readyz. A refusal at start
 * stops the gateway instead (main.ts), and is not said here.
 */
function reportCredentialRefusals(client: RedisClient, kind: Limiter['storeKind'], logger: Logger, started: () => boolean): void {
  let said = false
  watchCredentialRefusals(client, () => {
    const refused = redisRefusesCredentials(client)
    if (refused !== undefined) {
      if (said || !started()) return
      said = true
      logger.error({ problem: refused }, `Redis refuses the gateway's credentials: fix ${redisCredentialVariables(kind)}; limits follow onStoreFailure until it accepts them`)
    } else if (said && client.status === 'ready') {
      said = false
      logger.info('Redis accepts the gateway\'s credentials again')
    }
  })
}

/** How long the calls Redis refused must go without a refusal, one served meanwhile, before the log says Redis permits them again. */
const PERMITTED_AFTER_QUIET_MILLIS = 10_000

/** What a call needs Redis to permit: a decision (`rl:*` keys) or a guess's per-IP count (`anon:*`). */
type RefusableCall = 'decision' | 'guess'

/**
 * An ACL changed under a running gateway (a command or key pattern taken from its user) is, like
 * refused credentials, a misconfiguration no reconnect mends: every decision or guess fails the
 * same way. Said at error level once, naming the fix, not at every request; again only once the
 * calls that were refused have gone 10 s without a refusal and one of them was served since.
 * Kept per kind of call and failure domain: decisions and guesses touch different key patterns,
 * and on a Cluster each master has its own ACL, so decisions served, or another master serving,
 * say nothing of the calls still refused (key guesses are sparse: each would otherwise be a
 * "permits again" line and a new error). A domain that no longer holds keys (failover, reshard) is
 * not waited for. Requests follow onStoreFailure meanwhile. A refusal at start stops the gateway
 * instead (main.ts). Call with the error of a failed call, or none, and what the call was for.
 */
function permissionRefusalReporter(
  kind: Limiter['storeKind'],
  keyPrefix: string,
  logger: Logger,
  where: { domainOf(call: RefusableCall, id: string): string; holdsKeys?(domain: string): boolean },
  clock = () => performance.now(),
) {
  // `${call} ${domain}` of the calls refused since the error line → its domain and last refusal.
  const refused = new Map<string, { domain: string; at: number }>()
  // Called with every decision and guess: a served call costs one comparison while nothing was said.
  return (error: unknown, call: RefusableCall, id: string): void => {
    if (error === undefined) {
      if (refused.size === 0) return
      const now = clock()
      const source = `${call} ${where.domainOf(call, id)}`
      const last = refused.get(source)
      if (last !== undefined && now - last.at >= PERMITTED_AFTER_QUIET_MILLIS) refused.delete(source)
      for (const [other, { domain }] of refused) if (where.holdsKeys?.(domain) === false) refused.delete(other)
      if (refused.size === 0) logger.info('Redis permits the gateway\'s commands and keys again')
      return
    }
    const words = redisRefusesPermission(error)
    if (words === undefined) return
    const domain = where.domainOf(call, id)
    const first = refused.size === 0
    refused.set(`${call} ${domain}`, { domain, at: clock() })
    if (!first) return
    logger.error({ problem: words }, `Redis refuses the gateway a command or key it needs: ${redisAclFix(kind, keyPrefix)}; limits follow onStoreFailure until it has them`)
  }
}

/** How long key guesses must go without a failed call before the log says their count recovered. */
const GUESSES_QUIET_BEFORE_RECOVERED_MILLIS = 10_000
/** How long their calls must keep failing before the log says, at error level, that the count is failing. */
const GUESSES_FAILING_BEFORE_ERROR_MILLIS = 1_000

/**
 * The per-IP count of key guesses in Redis: its calls in the store's metrics beside the keyed
 * decisions (so RateLimitStoreErrors sees them), and log lines when they start failing and when
 * they have recovered. Meanwhile each gateway counts guesses alone, so N gateways let N times
 * the limit through, and an outage that keyed traffic does not happen to meet would otherwise go
 * unseen. The first failure is a warning (one stall on a busy machine fails every call it holds
 * at once); failures still coming a second later are the outage, said once at error level.
 * Recovered means no failure for 10 s: on a Redis Cluster with one master down, guesses from
 * different addresses fail and succeed in turn, and that is one outage.
 */
export function guessCallReporter(kind: Limiter['storeKind'], observer: StoreObserver | undefined, logger: Logger, clock = () => performance.now()) {
  let failingSince: number | undefined
  let errorSaid = false
  let lastFailure = -Infinity
  let servedSinceFailure = false
  // Recovered: a call served, and no failure for 10 s. Checked at a failure too: guesses can be
  // sparse, and a late reply minutes after the last one is a new warning, not the outage's error.
  const recovered = (now: number) => {
    if (failingSince === undefined || !servedSinceFailure || now - lastFailure < GUESSES_QUIET_BEFORE_RECOVERED_MILLIS) return
    failingSince = undefined
    errorSaid = false
    logger.info('per-IP count of key guesses recovered: shared in Redis again')
  }
  return (seconds: number, result: 'ok' | 'timeout' | 'error', error?: unknown): void => {
    observer?.call(kind, seconds, result)
    const now = clock()
    if (result === 'ok') {
      servedSinceFailure = true
      return recovered(now)
    }
    recovered(now)
    lastFailure = now
    servedSinceFailure = false
    if (failingSince === undefined) {
      failingSince = now
      logger.warn({ err: error }, 'per-IP count of key guesses: a call to Redis failed; counted by this gateway alone meanwhile')
    } else if (!errorSaid && now - failingSince >= GUESSES_FAILING_BEFORE_ERROR_MILLIS) {
      errorSaid = true
      logger.error({ err: error }, 'per-IP count of key guesses failing in Redis: each gateway counts guesses alone until it recovers')
    }
  }
}

/** How often a fallback too small for the keys in use says so. */
const FALLBACK_FULL_WARNING_MILLIS = 60_000

/**
 * The per-process limits for onStoreFailure=open, bounded like the key cache. With more keys in
 * use than that, the least recently used are forgotten and go unlimited until Redis is back: the
 * log says so (at most once a minute), since the fix is the operator's, keyCache.maxEntries.
 */
function fallbackStore(maxKeys: number, logger: Logger): LimitStore {
  let warnedAt = -Infinity
  return createMemoryStore({
    maxKeys,
    onFull() {
      const now = performance.now()
      if (now - warnedAt < FALLBACK_FULL_WARNING_MILLIS) return
      warnedAt = now
      logger.warn(
        { maxKeys },
        'per-process rate limits (Redis failing) hold keyCache.maxEntries keys and more are in use: the least recently used are forgotten and not limited; raise keyCache.maxEntries',
      )
    },
  })
}

type PermissionRefusals = ReturnType<typeof permissionRefusalReporter>

/** Custom limits no probe reaches on the configured windows: a probe is always a full decision, never a strike. */
const PROBE_KEY = { plan: 'readiness-probe', perMinute: 1_000_000_000, perDay: 1_000_000_000 }

/** The store with every call counted by `observer` and, failed or served, told to `refusals`. */
function observed(store: LimitStore, kind: Limiter['storeKind'], observer: StoreObserver | undefined, refusals?: PermissionRefusals): LimitStore {
  if (!observer && !refusals) return store
  return {
    ...store,
    async consume(request) {
      const started = performance.now()
      try {
        const decision = await store.consume(request)
        observer?.call(kind, (performance.now() - started) / 1_000, 'ok')
        refusals?.(undefined, 'decision', request.keyId)
        return decision
      } catch (error) {
        const result = error instanceof RedisBudgetExceededError ? 'timeout' : 'error'
        observer?.call(kind, (performance.now() - started) / 1_000, result)
        refusals?.(error, 'decision', request.keyId)
        throw error
      }
    },
  }
}
