import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Counter, Histogram, type Registry } from 'prom-client'

/** Status class ("2xx" …) keeps the label set bounded whatever statuses appear. */
export function statusClass(status: number): string {
  return `${Math.floor(status / 100)}xx`
}

/**
 * A metric's children for a label set, made on first use and kept: prom-client hashes a label
 * object on every call, which the hot path need not pay for a set it has already seen.
 */
export function labelChildren<Child>(make: (...values: string[]) => Child): (...values: string[]) => Child {
  const children = new Map<string, Child>()
  return (...values) => {
    const id = values.join('\u0000')
    let child = children.get(id)
    if (child === undefined) {
      child = make(...values)
      children.set(id, child)
    }
    return child
  }
}

/**
 * Request count and latency by route template (never the raw path: ids would make the label
 * set unbounded), method and status class.
 */
export const httpMetrics = fp(
  async (app: FastifyInstance, options: { registry: Registry }) => {
    const labelNames = ['method', 'route', 'status_class'] as const
    const requests = new Counter({
      name: 'http_requests_total',
      help: 'HTTP requests answered, by route template, method and status class.',
      labelNames,
      registers: [options.registry],
    })
    const duration = new Histogram({
      name: 'http_request_duration_seconds',
      help: 'Time from request received to response sent, by route template, method and status class.',
      labelNames,
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [options.registry],
    })
    // The label sets are bounded: route templates × methods × status classes.
    const children = labelChildren((method, route, status_class) => {
      const labels = { method, route, status_class }
      return { count: requests.labels(labels), time: duration.labels(labels) }
    })
    app.addHook('onResponse', (request, reply, done) => {
      const child = children(request.method, request.routeOptions.url ?? 'unmatched', statusClass(reply.statusCode))
      child.count.inc()
      child.time.observe(reply.elapsedTime / 1000)
      done()
    })
  },
  { name: 'http-metrics' },
)
