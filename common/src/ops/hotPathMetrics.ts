import type { Metric, Registry } from 'prom-client'

/**
 * Counter and histogram families for the request path, exported exactly as prom-client's own.
 *
 * prom-client validates and hashes the label object on every inc() and observe(), a labelled
 * child's included (≈ 1 µs a call in a loop, more under load; a gateway request makes seven).
 * These resolve a label set once, on its first use, and from then on count in plain numbers; the
 * registry reads them at scrape time like any other family. As with prom-client, the label values
 * must come from bounded sets (route templates, plans, status classes), never from a request.
 */

type LabelValues = Record<string, string>

interface Sample {
  labels: Record<string, string | number>
  value: number
  metricName?: string
}

interface FamilyOptions {
  name: string
  help: string
  labelNames: readonly string[]
  registers: Registry[]
}

abstract class Family<Series, Child> {
  /** Read by prom-client's registry, as of its own metric classes (Registry.aggregate). */
  readonly aggregator = 'sum'
  readonly name: string
  readonly help: string
  abstract readonly type: 'counter' | 'histogram'
  private readonly labelNames: readonly string[]
  /** Every series, in the order first used. */
  private series: { labels: LabelValues; series: Series; child: Child }[] = []
  /** Label values → child, one Map level per label: a lookup builds no string. */
  private children = new Map<string, unknown>()

  constructor(options: FamilyOptions) {
    this.name = options.name
    this.help = options.help
    this.labelNames = options.labelNames
    // The registry needs name, help, type, get() and reset(): the contract its own classes meet.
    for (const registry of options.registers) registry.registerMetric(this as unknown as Metric)
  }

  protected abstract newSeries(): Series
  protected abstract childOf(series: Series): Child
  protected abstract samples(labels: LabelValues, series: Series): Sample[]

  /** What counts for these label values (in labelNames order): made on first use, then kept. */
  labels(...values: string[]): Child {
    if (values.length !== this.labelNames.length) {
      throw new Error(`${this.name} takes the labels ${this.labelNames.join(', ')}; got ${values.length} values`)
    }
    let level = this.children
    const last = values.length - 1
    for (let index = 0; index < last; index++) {
      const value = values[index] as string
      let next = level.get(value) as Map<string, unknown> | undefined
      if (next === undefined) level.set(value, (next = new Map()))
      level = next
    }
    const child = level.get(values[last] as string) as Child | undefined
    return child ?? this.newChild(level, values)
  }

  private newChild(level: Map<string, unknown>, values: string[]): Child {
    const labels: LabelValues = {}
    this.labelNames.forEach((name, index) => (labels[name] = values[index] as string))
    const series = this.newSeries()
    const child = this.childOf(series)
    this.series.push({ labels, series, child })
    level.set(values[values.length - 1] as string, child)
    return child
  }

  async get() {
    const values: Sample[] = []
    for (const { labels, series } of this.series) values.push(...this.samples(labels, series))
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator }
  }

  reset(): void {
    this.series = []
    this.children = new Map()
  }
}

export class HotPathCounter extends Family<{ value: number }, { inc(by?: number): void }> {
  readonly type = 'counter'

  protected newSeries() {
    return { value: 0 }
  }

  protected childOf(series: { value: number }) {
    return {
      inc(by = 1) {
        series.value += by
      },
    }
  }

  protected samples(labels: LabelValues, series: { value: number }): Sample[] {
    return [{ labels, value: series.value }]
  }
}

interface HistogramSeries {
  /** Observations per bucket (not cumulative); the last one is +Inf's own. */
  counts: Float64Array
  sum: number
  count: number
}

export class HotPathHistogram extends Family<HistogramSeries, { observe(value: number): void }> {
  readonly type = 'histogram'
  private readonly upperBounds: readonly number[]

  constructor(options: FamilyOptions & { buckets: readonly number[] }) {
    super(options)
    this.upperBounds = [...options.buckets].sort((a, b) => a - b)
  }

  protected childOf(series: HistogramSeries) {
    const bounds = this.upperBounds
    return {
      observe(value: number) {
        if (!Number.isFinite(value)) return
        let bucket = 0
        while (bucket < bounds.length && value > (bounds[bucket] as number)) bucket++
        series.counts[bucket] = (series.counts[bucket] as number) + 1
        series.sum += value
        series.count += 1
      },
    }
  }

  protected newSeries(): HistogramSeries {
    return { counts: new Float64Array(this.upperBounds.length + 1), sum: 0, count: 0 }
  }

  protected samples(labels: LabelValues, series: HistogramSeries): Sample[] {
    const bucketName = `${this.name}_bucket`
    let cumulative = 0
    const samples: Sample[] = this.upperBounds.map((le, index) => {
      cumulative += series.counts[index] as number
      return { labels: { le, ...labels }, value: cumulative, metricName: bucketName }
    })
    samples.push(
      { labels: { le: '+Inf', ...labels }, value: series.count, metricName: bucketName },
      { labels, value: series.sum, metricName: `${this.name}_sum` },
      { labels, value: series.count, metricName: `${this.name}_count` },
    )
    return samples
  }
}
