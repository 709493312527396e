import { Counter, Gauge, type Registry } from 'prom-client'
import { statusClass } from '../../../common/src/ops/httpMetrics.ts'
import { HotPathCounter, HotPathHistogram } from '../../../common/src/ops/hotPathMetrics.ts'
import type { AuthFailureReason } from '../auth/authenticate.ts'
import type { TlsPair } from '../config/tlsFiles.ts'
import { HANDSHAKE_FAILURE_REASONS, type HandshakeFailureReason } from '../handshakeFailures.ts'
import type { KeyCache } from '../keys/keyCache.ts'
import { UPSTREAM_FAILURE_KINDS, type UpstreamFailureKind } from '../proxy/upstreamFailure.ts'
import type { UpstreamObserver } from '../proxy/upstreamProxy.ts'
import type { BanCache } from '../rateLimit/banCache.ts'
import type { StoreObserver } from '../rateLimit/limiter.ts'
import type { RateLimitObserver } from '../rateLimit/rateLimit.ts'

/** A window at or past this share of its limit counts as near its limit. */
export const NEAR_LIMIT_RATIO = 0.8

/**
 * The gateway's own metric families. Labels stay bounded: plan, window, outcome, reason,
 * upstream name, status class; never a key, a key id or a raw path.
 */
export function createGatewayMetrics(registry: Registry) {
  const registers = [registry]

  const authFailures = new HotPathCounter({
    name: 'gateway_auth_failures_total',
    help: 'Requests whose API key was refused, by reason (missing, malformed, unknown, revoked_or_expired, over_ip_limit).',
    labelNames: ['reason'],
    registers,
  })

  const upstreamDuration = new HotPathHistogram({
    name: 'gateway_upstream_duration_seconds',
    help: 'Time from handing a request to the upstream to its response headers, by upstream and status class.',
    labelNames: ['upstream', 'status_class'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers,
  })
  const upstreamErrors = new Counter({
    name: 'gateway_upstream_errors_total',
    help: 'Upstream requests that failed without an answer, by upstream and kind (timeout, connect, protocol, saturated: refused unsent).',
    labelNames: ['upstream', 'kind'],
    registers,
  })
  const upstreamResent = new Counter({
    name: 'gateway_upstream_resent_total',
    help: 'GET, HEAD and OPTIONS requests, and POSTs with an Idempotency-Key to the pets-service, sent to the upstream a second time because the connection they went out on closed without an answer, or the upstream answered 408 (it timed out the connection before reading the request), by upstream.',
    labelNames: ['upstream'],
    registers,
  })

  const configReloads = new Counter({
    name: 'gateway_config_reloads_total',
    help: 'Config reloads (SIGHUP or file change), by outcome (success, failure: the running config stays).',
    labelNames: ['outcome'],
    registers,
  })
  const lastReloadSuccessful = new Gauge({
    name: 'gateway_config_last_reload_successful',
    help: '1 when the config file was valid at the last reload (or none happened since start), 0 while a refused one has not been followed by a valid one: the file on disk is not the config in force.',
    registers,
  })
  lastReloadSuccessful.set(1)

  // Every request records a decision; plans, outcomes, sources and windows are bounded sets.
  const requests = new HotPathCounter({
    name: 'gateway_rate_limit_requests_total',
    help: 'Rate-limit decisions by plan ("anonymous" for per-IP), outcome and source (store, fallback, ban_cache, anonymous).',
    labelNames: ['plan', 'outcome', 'source'],
    registers,
  })
  const windowDecisions = new HotPathCounter({
    name: 'gateway_rate_limit_window_decisions_total',
    help: 'Per window, whether it still had room (allowed) or was spent (exceeded) when a request was decided.',
    labelNames: ['plan', 'window', 'outcome'],
    registers,
  })
  const nearLimit = new HotPathCounter({
    name: 'gateway_rate_limit_near_limit_total',
    help: `Admitted requests after which a window is at least ${NEAR_LIMIT_RATIO * 100} % used.`,
    labelNames: ['plan', 'window'],
    registers,
  })
  const bans = new Counter({
    name: 'gateway_bans_total',
    help: 'Bans started, by ladder step (0 = first step).',
    labelNames: ['step'],
    registers,
  })
  const storeDuration = new HotPathHistogram({
    name: 'gateway_rate_limit_store_duration_seconds',
    help: 'Time of one rate-limit store call (one Redis round trip), by store.',
    labelNames: ['store'],
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
    registers,
  })
  const storeErrors = new Counter({
    name: 'gateway_rate_limit_store_errors_total',
    help: 'Rate-limit store calls that failed, by store and kind (timeout: past the budget; error: refused, OOM, …).',
    labelNames: ['store', 'kind'],
    registers,
  })

  const rateLimit: RateLimitObserver = {
    decision(event) {
      requests.labels(event.plan, event.outcome, event.source).inc()
      for (const window of event.windows ?? []) {
        const exceeded = event.outcome !== 'admitted' && window.remaining === 0
        windowDecisions.labels(event.plan, window.name, exceeded ? 'exceeded' : 'allowed').inc()
        if (event.outcome === 'admitted' && window.limit - window.remaining >= NEAR_LIMIT_RATIO * window.limit) {
          nearLimit.labels(event.plan, window.name).inc()
        }
      }
    },
    newBan(step) {
      bans.inc({ step: String(step) })
    },
  }

  const store: StoreObserver & { expect(kind: string): void } = {
    /** Starts the store's error series at zero. */
    expect(kind) {
      for (const result of ['timeout', 'error']) storeErrors.inc({ store: kind, kind: result }, 0)
    },
    call(kind, seconds, result) {
      storeDuration.labels(kind).observe(seconds)
      if (result !== 'ok') storeErrors.inc({ store: kind, kind: result })
    },
  }

  // Known label sets start at zero, so dashboards and alerts see the series before the first event.
  for (const reason of ['missing', 'malformed', 'unknown', 'revoked_or_expired', 'over_ip_limit']) authFailures.labels(reason).inc(0)

  // Each upstream's outstanding requests, read when scraped, beside the bound past which the
  // gateway refuses with 503: their ratio is how close a slow or hung upstream is to that.
  const outstanding = new Map<string, { count: () => number; limit: number }>()
  new Gauge({
    name: 'gateway_upstream_in_flight',
    help: 'Requests handed to the upstream and not yet ended (answered, failed or given up), by upstream.',
    labelNames: ['upstream'],
    registers,
    collect() {
      for (const [name, tracked] of outstanding) this.set({ upstream: name }, tracked.count())
    },
  })
  new Gauge({
    name: 'gateway_upstream_max_in_flight',
    help: 'upstreams.<name>.maxInFlight: outstanding requests past which the gateway answers 503 without sending, by upstream.',
    labelNames: ['upstream'],
    registers,
    collect() {
      for (const [name, tracked] of outstanding) this.set({ upstream: name }, tracked.limit)
    },
  })
  for (const outcome of ['success', 'failure']) configReloads.inc({ outcome }, 0)

  const upstream: UpstreamObserver = {
    response: (name, status, seconds) => upstreamDuration.labels(name, statusClass(status)).observe(seconds),
    failure: (name, kind: UpstreamFailureKind) => upstreamErrors.inc({ upstream: name, kind }),
    resent: (name) => upstreamResent.inc({ upstream: name }),
    inFlight(name, count, limit) {
      outstanding.set(name, { count, limit })
      for (const kind of UPSTREAM_FAILURE_KINDS) upstreamErrors.inc({ upstream: name, kind }, 0)
      upstreamResent.inc({ upstream: name }, 0)
    },
  }

  return {
    authFailure: (reason: AuthFailureReason) => authFailures.labels(reason).inc(),
    upstream,
    rateLimit,
    store,
    configReload(outcome: 'success' | 'failure') {
      configReloads.inc({ outcome })
      lastReloadSuccessful.set(outcome === 'success' ? 1 : 0)
    },
    /** Starts each ladder step's ban series at zero, so that increase() counts a gateway's first bans. */
    expectBanSteps(steps: number): void {
      for (let step = 0; step < steps; step++) bans.inc({ step: String(step) }, 0)
    },

    /** Bans this gateway is answering from its local ban cache, read at scrape time. */
    observeBans(cache: BanCache): void {
      new Gauge({
        name: 'gateway_active_bans',
        help: 'API keys this gateway currently answers as banned without asking the store.',
        registers,
        collect() {
          this.set(cache.size)
        },
      })
    },

    /** Key-cache hit, miss and size, read from the cache at scrape time. */
    observeKeyCache(cache: KeyCache): void {
      let reported = { hits: 0, misses: 0 }
      const lookups = new Counter({
        name: 'gateway_key_cache_lookups_total',
        help: 'API key lookups by result: hit (answered from memory) or miss (asked Postgres).',
        labelNames: ['result'],
        registers,
        collect() {
          this.inc({ result: 'hit' }, cache.stats.hits - reported.hits)
          this.inc({ result: 'miss' }, cache.stats.misses - reported.misses)
          reported = { ...cache.stats }
        },
      })
      lookups.inc({ result: 'hit' }, 0)
      new Gauge({
        name: 'gateway_key_cache_entries',
        help: 'API keys (and remembered unknown keys) held in the key cache.',
        registers,
        collect() {
          this.set(cache.size)
        },
      })
    },
  }
}

export type GatewayMetrics = ReturnType<typeof createGatewayMetrics>

/**
 * Only with server.tls: `gateway_tls_reloads_total{outcome}` and `gateway_tls_last_reload_successful`
 * (as the config's: 0 while the last rotation was refused, the files on disk not the pair in force),
 * `gateway_tls_certificate_expiry_timestamp_seconds`, the end of the certificate in force, and
 * `gateway_tls_handshake_failures_total{reason}`, handshakes on the public port that failed.
 */
export function createTlsMetrics(registry: Registry) {
  const registers = [registry]
  const reloads = new Counter({
    name: 'gateway_tls_reloads_total',
    help: 'Certificate reloads of the public port (SIGHUP or a change of server.tls files), by outcome (success, failure: the certificate in force stays).',
    labelNames: ['outcome'],
    registers,
  })
  for (const outcome of ['success', 'failure']) reloads.inc({ outcome }, 0)
  const lastReloadSuccessful = new Gauge({
    name: 'gateway_tls_last_reload_successful',
    help: '1 when the certificate files were a valid pair at the last reload (or none happened since start), 0 while a refused one has not been followed by a valid one.',
    registers,
  })
  lastReloadSuccessful.set(1)
  const expiry = new Gauge({
    name: 'gateway_tls_certificate_expiry_timestamp_seconds',
    help: 'When the certificate the public port serves to new connections expires (Unix time).',
    registers,
  })
  const inForce = (pair: TlsPair) => expiry.set(pair.validTo.getTime() / 1_000)
  const handshakeFailures = new Counter({
    name: 'gateway_tls_handshake_failures_total',
    help: `TLS handshakes on the public port that failed, by reason (${HANDSHAKE_FAILURE_REASONS.join(', ')}).`,
    labelNames: ['reason'],
    registers,
  })
  for (const reason of HANDSHAKE_FAILURE_REASONS) handshakeFailures.inc({ reason }, 0)
  return {
    inForce,
    handshakeFailure: (reason: HandshakeFailureReason) => handshakeFailures.inc({ reason }),
    reload(outcome: 'success' | 'failure', pair: TlsPair) {
      reloads.inc({ outcome })
      lastReloadSuccessful.set(outcome === 'success' ? 1 : 0)
      inForce(pair)
    },
  }
}
