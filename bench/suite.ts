import {
  gateway401Target,
  gateway429Target,
  gatewayAutoPipeliningTarget,
  gatewayBannedTarget,
  gatewayLogWarnTarget,
  gatewayMemoryStoreTarget,
  gatewayReplyFromTarget,
  gatewayTarget,
  fullStackTarget,
} from './targets/gateway.ts'
import { nginxTarget } from './targets/nginx.ts'
import { minimalPetsTarget } from './targets/minimalPets.ts'
import { petsServiceTarget } from './targets/petsService.ts'
import { busyUpstreamTargets, directUpstreamTarget, httpProxyTarget, peerTarget, proxyStageTarget } from './targets/proxyRows.ts'
import type { BenchTarget, Goal } from './targets/types.ts'

/**
 * Everything `npm run bench` measures by default, one table row per target, in this order. To add
 * a row, write a module in bench/targets/ and list it here; add a goal to compare two rows.
 *
 * The proxy rows share one static upstream (bench/servers/staticUpstream.ts) and one private
 * redis-server; the four gateway rows share one gateway process. The full-stack row is a second
 * gateway in front of the pets-service row's own process. nginx is listed as skipped when it is not
 * installed.
 */
export const TARGETS: BenchTarget[] = [
  petsServiceTarget({ id: 'pets-service', label: 'pets-service', logLevel: 'info' }),
  minimalPetsTarget,
  fullStackTarget,
  directUpstreamTarget,
  nginxTarget,
  httpProxyTarget,
  proxyStageTarget,
  peerTarget,
  gatewayTarget,
  gateway401Target,
  gateway429Target,
  gatewayBannedTarget,
]

/**
 * Experiments: run only when named in BENCH_TARGETS, e.g.
 * BENCH_TARGETS=pets-service,pets-service-log-warn,minimal-pets npm run bench
 */
export const OPTIONAL_TARGETS: BenchTarget[] = [
  petsServiceTarget({
    id: 'pets-service-log-warn',
    label: 'pets-service, LOG_LEVEL=warn (experiment)',
    logLevel: 'warn',
  }),
  gatewayLogWarnTarget,
  gatewayMemoryStoreTarget,
  gatewayReplyFromTarget,
  gatewayAutoPipeliningTarget,
  ...busyUpstreamTargets,
]

/** Throughput goals read the closed-loop level BENCH_GOAL_CONNECTIONS (100 by default). */
export const GOALS: Goal[] = [
  { kind: 'throughput', subject: 'pets-service', baseline: 'minimal-pets', minRatio: 0.9 },
  // The whole stack (gateway → pets-service → Postgres) against the pets-service alone.
  { kind: 'throughput', subject: 'full-stack', baseline: 'pets-service', minRatio: 0.9 },
  // Issue 3: authentication through the key cache is nearly free.
  { kind: 'throughput', subject: 'gateway', baseline: 'http-proxy', minRatio: 0.95 },
  // Issue 4: key auth + both sliding windows + the proxy (Kong reports 0.74× for the same against its bare proxy).
  { kind: 'throughput', subject: 'gateway', baseline: 'http-proxy', minRatio: 0.9 },
  { kind: 'throughput', subject: 'gateway', baseline: 'peer', minRatio: 1.5 },
  { kind: 'throughput', subject: 'gateway-401', baseline: 'http-proxy', minRatio: 3 },
  { kind: 'throughput', subject: 'gateway-429', baseline: 'http-proxy', minRatio: 3 },
  { kind: 'throughput', subject: 'gateway-banned', baseline: 'http-proxy', minRatio: 3 },
  { kind: 'redis-commands', subject: 'gateway', perRequest: 1 },
  { kind: 'redis-commands', subject: 'gateway-banned', perRequest: 0 },
  { kind: 'added-latency', subject: 'gateway', baseline: 'http-proxy', load: 0.5, percentile: 'p99', maxAddedMillis: 3 },
]
