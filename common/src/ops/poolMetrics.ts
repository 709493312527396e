import type pg from 'pg'
import { Gauge, type Registry } from 'prom-client'

/** Postgres pool gauges, read at scrape time: a growing `waiting` count is the first sign of trouble. */
export function registerPoolMetrics(registry: Registry, pool: pg.Pool): void {
  new Gauge({
    name: 'pg_pool_connections',
    help: 'Postgres pool connections by state (total, idle, waiting callers), and the most it opens (max).',
    labelNames: ['state'],
    registers: [registry],
    collect() {
      this.set({ state: 'total' }, pool.totalCount)
      this.set({ state: 'idle' }, pool.idleCount)
      this.set({ state: 'waiting' }, pool.waitingCount)
      this.set({ state: 'max' }, pool.options.max)
    },
  })
}
