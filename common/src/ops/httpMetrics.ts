import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { REQUEST_COUNT, markAccounted, whenAnswerCutShort } from '../http/requestContext.ts'
import fp from 'fastify-plugin'
import type { Registry } from 'prom-client'
import { HotPathCounter, HotPathHistogram } from './hotPathMetrics.ts'

/** Status class ("2xx" …) keeps the label set bounded whatever statuses appear. */
export function statusClass(status: number): string {
  return `${Math.floor(status / 100)}xx`
}

/**
 * The methods an HTTP API is asked with keep their own label; every other one a client sends
 * (Node's parser knows 34: PROPFIND, M-SEARCH, PURGE …) is counted as "other", so a client
 * cannot multiply the series by cycling through them.
 */
const LABELLED_METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

function methodLabel(method: string): string {
  return LABELLED_METHODS.has(method) ? method : 'other'
}

/**
 * Request count and latency by route template (never the raw path: ids would make the label
 * set unbounded), method and status class, and by plan where the service knows one (the gateway:
 * plans come from its config, a bounded set).
 */
export const httpMetrics = fp(
  async (app: FastifyInstance, options: { registry: Registry; plan?: (request: FastifyRequest) => string }) => {
    const plan = options.plan
    const labelNames = plan ? ['method', 'route', 'status_class', 'plan'] : ['method', 'route', 'status_class']
    const by = plan ? 'route template, method, status class and plan' : 'route template, method and status class'
    const requests = new HotPathCounter({
      name: 'http_requests_total',
      help: `HTTP requests answered, by ${by}.`,
      labelNames,
      registers: [options.registry],
    })
    const duration = new HotPathHistogram({
      name: 'http_request_duration_seconds',
      help: `Time from request received to response sent, by ${by}.`,
      labelNames,
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [options.registry],
    })
    // status_class cannot tell a 501 (a client asking for what is not implemented: /v1/store/orders,
    // a transfer coding other than chunked) or a 505 (an HTTP/2.0 request line) from a server
    // fault, and the error-ratio alert must not page for what a client alone causes. Only 5xx
    // answers are counted here, so the label is bounded (500–599) and costs nothing on other
    // answers; 500–504 exist from the start, so a rate over them sees the first one.
    const serverErrors = new HotPathCounter({
      name: 'http_server_error_responses_total',
      help: 'HTTP requests answered with a 5xx status (RFC 9110 "server error"), by status.',
      labelNames: ['status'],
      registers: [options.registry],
    })
    for (const status of ['500', '501', '502', '503', '504']) serverErrors.labels(status)
    // The label sets are bounded: route templates × 8 method labels × status classes (× configured plans).
    function count(request: FastifyRequest, reply: FastifyReply, status: number): void {
      const method = methodLabel(request.method)
      const route = request.routeOptions.url ?? 'unmatched'
      const statusLabel = statusClass(status)
      const seconds = reply.elapsedTime / 1000
      if (status >= 500) serverErrors.labels(String(status)).inc()
      if (plan) {
        const planLabel = plan(request)
        requests.labels(method, route, statusLabel, planLabel).inc()
        duration.labels(method, route, statusLabel, planLabel).observe(seconds)
      } else {
        requests.labels(method, route, statusLabel).inc()
        duration.labels(method, route, statusLabel).observe(seconds)
      }
    }
    app.addHook('onRequest', (request, reply, done) => {
      whenAnswerCutShort(reply, REQUEST_COUNT, (status) => count(request, reply, status))
      done()
    })
    app.addHook('onResponse', (request, reply, done) => {
      markAccounted(reply.raw, REQUEST_COUNT)
      count(request, reply, reply.statusCode)
      done()
    })
  },
  { name: 'http-metrics' },
)
