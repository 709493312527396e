import { Counter, Gauge, Histogram, type Registry } from 'prom-client'
import { statusClass } from '../../../common/src/ops/httpMetrics.ts'
import type { AuthFailureReason } from '../auth/authenticate.ts'
import type { KeyCache } from '../keys/keyCache.ts'
import type { UpstreamFailureKind, UpstreamObserver } from '../proxy/upstreamProxy.ts'

/**
 * The gateway's own metric families. Labels stay bounded: plan, window, outcome, reason,
 * upstream name, status class; never a key, a key id or a raw path.
 */
export function createGatewayMetrics(registry: Registry) {
  const registers = [registry]

  const authFailures = new Counter({
    name: 'gateway_auth_failures_total',
    help: 'Requests whose API key was refused, by reason (missing, malformed, unknown, revoked_or_expired).',
    labelNames: ['reason'],
    registers,
  })

  const upstreamDuration = new Histogram({
    name: 'gateway_upstream_duration_seconds',
    help: 'Time from handing a request to the upstream to its response headers, by upstream and status class.',
    labelNames: ['upstream', 'status_class'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers,
  })
  const upstreamErrors = new Counter({
    name: 'gateway_upstream_errors_total',
    help: 'Upstream requests that failed without an answer, by upstream and kind (timeout, connect, protocol).',
    labelNames: ['upstream', 'kind'],
    registers,
  })

  const configReloads = new Counter({
    name: 'gateway_config_reloads_total',
    help: 'Config reloads (SIGHUP or file change), by outcome (success, failure: the running config stays).',
    labelNames: ['outcome'],
    registers,
  })

  const upstream: UpstreamObserver = {
    response: (name, status, seconds) => upstreamDuration.observe({ upstream: name, status_class: statusClass(status) }, seconds),
    failure: (name, kind: UpstreamFailureKind) => upstreamErrors.inc({ upstream: name, kind }),
  }

  return {
    authFailure: (reason: AuthFailureReason) => authFailures.inc({ reason }),
    upstream,
    configReload: (outcome: 'success' | 'failure') => configReloads.inc({ outcome }),

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
