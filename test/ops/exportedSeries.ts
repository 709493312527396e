import { createServer } from 'node:net'
import Fastify from 'fastify'
import type pg from 'pg'
import { Registry } from 'prom-client'
import { collectProcessMetrics } from '../../common/src/ops/processMetrics.ts'
import { registerConnectionMetrics } from '../../common/src/ops/connectionMetrics.ts'
import { httpMetrics } from '../../common/src/ops/httpMetrics.ts'
import { countParserRefusals } from '../../common/src/ops/parserRefusals.ts'
import { registerPoolMetrics } from '../../common/src/ops/poolMetrics.ts'
import { capConnectionsPerClient } from '../../gateway/src/connectionsPerClient.ts'
import type { KeyCache } from '../../gateway/src/keys/keyCache.ts'
import { createGatewayMetrics, createTlsMetrics } from '../../gateway/src/metrics/gatewayMetrics.ts'
import type { BanCache } from '../../gateway/src/rateLimit/banCache.ts'

/** Series Prometheus itself attaches to every target, whatever the target exports. */
export const PROMETHEUS_SYNTHETIC = new Set(['up', 'scrape_duration_seconds', 'scrape_samples_scraped', 'scrape_samples_post_metric_relabeling', 'scrape_series_added'])

/** Labels Prometheus adds to every scraped series. */
export const TARGET_LABELS = new Set(['job', 'instance'])

export type Job = 'gateway' | 'pets-service'

/** Sample names a registry's families produce: a histogram's _bucket, _sum and _count, and so on. */
export async function sampleNames(registry: Registry): Promise<Set<string>> {
  const names = new Set<string>()
  for (const family of await registry.getMetricsAsJSON()) {
    const type = String(family.type)
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(`${family.name}${suffix}`)
    else if (type === 'summary') for (const suffix of ['', '_sum', '_count']) names.add(`${family.name}${suffix}`)
    else names.add(family.name)
  }
  return names
}

/**
 * The metric families each service registers, built from the same code its main.ts runs (the
 * gateway's and the shared ones, prom-client's defaults), with stand-ins for the objects read at
 * scrape time. No server, database or Redis: the unit-level counterpart of a live scrape.
 */
export async function registeredSeries(): Promise<Record<Job, Set<string>>> {
  const build = async (job: Job) => {
    const registry = new Registry()
    collectProcessMetrics(registry)
    registerPoolMetrics(registry, { totalCount: 0, idleCount: 0, waitingCount: 0, options: { max: 10 } } as unknown as pg.Pool)
    registerConnectionMetrics(registry, { public: createServer(), ops: createServer() })
    countParserRefusals(registry)
    if (job === 'gateway') {
      capConnectionsPerClient(createServer(), { limit: 1, isTrustedProxy: () => false, registry, logger: { warn: () => undefined } })
      const metrics = createGatewayMetrics(registry)
      metrics.observeKeyCache({ stats: { hits: 0, misses: 0 }, size: 0 } as unknown as KeyCache)
      metrics.observeBans({ size: 0 } as unknown as BanCache)
      // Registered only when server.tls names a certificate, as main.ts does.
      createTlsMetrics(registry)
    }
    const app = Fastify()
    await app.register(httpMetrics, { registry })
    await app.ready()
    await app.close()
    return sampleNames(registry)
  }
  return { gateway: await build('gateway'), 'pets-service': await build('pets-service') }
}

/** The sample names and, per name, the label names of a Prometheus text exposition. */
export function parseExposition(text: string): Map<string, Set<string>> {
  const series = new Map<string, Set<string>>()
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue
    const match = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s/.exec(line)
    if (!match) continue
    const labels = series.get(match[1]!) ?? new Set<string>()
    for (const label of (match[2] ?? '').matchAll(/([A-Za-z_]\w*)="/g)) labels.add(label[1]!)
    series.set(match[1]!, labels)
  }
  return series
}
