import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Counter, Histogram, type Registry } from 'prom-client'

/** Status class ("2xx" …) keeps the label set bounded whatever statuses appear. */
export function statusClass(status: number): string {
  return `${Math.floor(status / 100)}xx`
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
    // prom-client hashes the label object on every call; the children for each label set are
    // looked up once and kept (the sets are bounded: route templates × methods × status classes).
    const children = new Map<string, { count: Counter.Internal; time: Histogram.Internal<string> }>()
    app.addHook('onResponse', (request, reply, done) => {
      const route = request.routeOptions.url ?? 'unmatched'
      const status = statusClass(reply.statusCode)
      const id = `${request.method} ${route} ${status}`
      let child = children.get(id)
      if (!child) {
        const labels = { method: request.method, route, status_class: status }
        child = { count: requests.labels(labels), time: duration.labels(labels) }
        children.set(id, child)
      }
      child.count.inc()
      child.time.observe(reply.elapsedTime / 1000)
      done()
    })
  },
  { name: 'http-metrics' },
)
