import type { Server } from 'node:net'
import { Counter, Gauge, type Registry } from 'prom-client'

/**
 * `http_connections{listener, state}` (open, and max: the cap) and
 * `http_connections_refused_total{listener}`: connections closed unread because the listener
 * already held its cap (connectionCap.ts). Open near max, or refusals rising, is a connection flood
 * or too small a cap; without these a flood shows only as clients' resets. `listener` is `public`
 * (the API port) or `ops`.
 */
export function registerConnectionMetrics(registry: Registry, listeners: Readonly<Record<'public' | 'ops', Server>>): void {
  const entries = Object.entries(listeners) as ['public' | 'ops', Server][]
  const refused = new Counter({
    name: 'http_connections_refused_total',
    help: 'Client connections closed as soon as accepted because the listener held its cap (http_connections{state="max"}), by listener.',
    labelNames: ['listener'],
    registers: [registry],
  })
  for (const [listener, server] of entries) {
    refused.inc({ listener }, 0)
    server.on('drop', () => refused.inc({ listener }))
  }
  new Gauge({
    name: 'http_connections',
    help: 'Client connections a listener holds (open) and the most it holds at once (max), by listener.',
    labelNames: ['listener', 'state'],
    registers: [registry],
    async collect() {
      for (const [listener, server] of entries) {
        const open = await new Promise<number>((resolve) => server.getConnections((error, count) => resolve(error ? 0 : count)))
        this.set({ listener, state: 'open' }, open)
        this.set({ listener, state: 'max' }, server.maxConnections ?? 0)
      }
    },
  })
}
