import { collectDefaultMetrics, type Registry } from 'prom-client'

/**
 * prom-client's gauges named like counters: `promtool check metrics` fails a scrape that holds them
 * (exit 3), so an operator's check of a live scrape failed on the library's defaults. Each is the
 * sum of its unsuffixed twin (`nodejs_active_handles` and the others, by type), which stays.
 */
const GAUGES_NAMED_AS_COUNTERS = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']

/** The process's own metrics (CPU, memory, event loop, GC, handles), as prom-client collects them. */
export function collectProcessMetrics(registry: Registry): void {
  collectDefaultMetrics({ register: registry })
  for (const name of GAUGES_NAMED_AS_COUNTERS) registry.removeSingleMetric(name)
}
