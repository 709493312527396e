import { Counter, Histogram, Registry } from 'prom-client'
import { describe, expect, it } from 'vitest'
import { HotPathCounter, HotPathHistogram } from '../../common/src/ops/hotPathMetrics.ts'

const observations: [method: string, route: string, seconds: number][] = [
  ['GET', '/pets', 0.0004],
  ['GET', '/pets', 0.001],
  ['GET', '/pets', 0.0031],
  ['POST', '/pets', 0.2],
  ['GET', '/pets/:petId', 2.5],
  ['GET', '/pets', 11],
  ['GET', '/pets', 0],
]

const BUCKETS = [0.001, 0.0025, 0.005, 0.1, 1, 2.5]
const family = (registry: Registry) => ({ labelNames: ['method', 'route'], registers: [registry] })

function ours(registry: Registry) {
  return {
    counter: new HotPathCounter({ name: 'requests_total', help: 'Requests.', ...family(registry) }),
    histogram: new HotPathHistogram({ name: 'duration_seconds', help: 'Duration.', buckets: BUCKETS, ...family(registry) }),
  }
}

function promClients(registry: Registry) {
  return {
    counter: new Counter({ name: 'requests_total', help: 'Requests.', ...family(registry) }),
    histogram: new Histogram({ name: 'duration_seconds', help: 'Duration.', buckets: BUCKETS, ...family(registry) }),
  }
}

type Families = Awaited<ReturnType<Registry['getMetricsAsJSON']>>

const samplesOf = (metrics: Families) =>
  metrics.map(({ name, help, type, values }) => ({
    name,
    help,
    type,
    values: values.map((sample) => ({ labels: sample.labels, value: sample.value, metricName: 'metricName' in sample ? sample.metricName : undefined })),
  }))

describe('request-path metrics', () => {
  it('scrape as exactly the same text as prom-client Counter and Histogram given the same observations', async () => {
    const mine = new Registry()
    const reference = new Registry()
    const mineFamilies = ours(mine)
    const referenceFamilies = promClients(reference)
    for (const [method, route, seconds] of observations) {
      mineFamilies.counter.labels(method, route).inc()
      mineFamilies.histogram.labels(method, route).observe(seconds)
      referenceFamilies.counter.inc({ method, route })
      referenceFamilies.histogram.observe({ method, route }, seconds)
    }
    const text = await mine.metrics()
    expect(text).toBe(await reference.metrics())
    expect(text).toContain('duration_seconds_bucket{le="0.001",method="GET",route="/pets"} 3')
    expect(text).toContain('requests_total{method="GET",route="/pets"} 5')
    // The JSON form too (tests and Registry.aggregate read it), minus prom-client's exemplar slots.
    expect(samplesOf(await mine.getMetricsAsJSON())).toEqual(samplesOf(await reference.getMetricsAsJSON()))
  })

  it('refuses a label set of the wrong size instead of exporting a series with missing labels', () => {
    const { counter } = ours(new Registry())
    expect(() => counter.labels('GET')).toThrow(/takes the labels method, route/)
  })

  it('starts again from nothing when the registry resets its metrics', async () => {
    const registry = new Registry()
    const { counter } = ours(registry)
    counter.labels('GET', '/pets').inc(3)
    registry.resetMetrics()
    counter.labels('GET', '/pets').inc()
    expect(await registry.metrics()).toContain('requests_total{method="GET",route="/pets"} 1')
  })
})
