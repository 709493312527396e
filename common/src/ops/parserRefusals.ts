import { Counter, type Registry } from 'prom-client'

/** Every status the HTTP parser's refusals can have (clientErrors.ts), each exported from the start. */
const REFUSAL_STATUSES = [400, 408, 414, 431, 501]

/**
 * `http_requests_refused_total{status}`: requests the HTTP parser refused before any route saw
 * them (bytes that are not HTTP, headers over 16 KiB, a request line too long, headers too slow,
 * an unknown method, CONNECT). They never reach http_requests_total, which counts routed requests;
 * without this a flood of them would show only in the log. Each status starts at zero, so a rate
 * over the counter sees the first refusals too.
 */
export function countParserRefusals(registry: Registry): (status: number) => void {
  const refused = new Counter({
    name: 'http_requests_refused_total',
    help: 'Requests refused by the HTTP parser before routing, by status (400 not HTTP, 408 too slow, 414 request line too long, 431 headers too large, 501 unknown method or CONNECT, the gateway only: the pets-service answers an unknown method 400).',
    labelNames: ['status'],
    registers: [registry],
  })
  for (const status of REFUSAL_STATUSES) refused.inc({ status: String(status) }, 0)
  return (status) => refused.inc({ status: String(status) })
}
