import { beforeAll, describe, expect, it } from 'vitest'
import { PROMETHEUS_SYNTHETIC, registeredSeries, type Job } from './exportedSeries.ts'
import {
  PROMTOOL_MISSING,
  dashboardExpressions,
  groupingLabels,
  jobsOf,
  lightSyntaxProblems,
  metricNames,
  promtool,
  promtoolParse,
  ruleExpressions,
  selectors,
  substituteGrafanaVariables,
  type Expression,
} from './promql.ts'

const expressions: Expression[] = [...ruleExpressions(), ...dashboardExpressions()]

describe('PromQL helpers', () => {
  it('find metric names, not functions, keywords, labels, durations or numbers', () => {
    expect(metricNames('histogram_quantile(0.99, sum by (job, le) (rate(foo_bucket{job="gateway",le!="1"}[5m]))) > 0.5')).toEqual(['foo_bucket'])
    expect(metricNames('a_total / on (instance) group_left (plan) b offset 5m or vector(0) unless c{x=~"y|z"}')).toEqual(['c', 'a_total', 'b'])
    expect(metricNames('sum(increase(x_total[15m])) > 10 and bool 1')).toEqual(['x_total'])
    expect(groupingLabels('sum by (plan, outcome) (rate(x[1m])) / on(plan) y')).toEqual(['plan', 'outcome', 'plan'])
    expect(substituteGrafanaVariables('rate(x{instance=~"$instance"}[$__rate_interval]) + increase(y[$__range])')).toBe(
      'rate(x{instance=~".*"}[1m]) + increase(y[1h])',
    )
  })

  it('the fallback syntax check refuses what is obviously broken', () => {
    expect(lightSyntaxProblems('sum(rate(x[5m]))')).toEqual([])
    expect(lightSyntaxProblems('sum(rate(x[5m])')).not.toEqual([])
    expect(lightSyntaxProblems('x{job="a}')).not.toEqual([])
    expect(lightSyntaxProblems('rate(x)')).not.toEqual([])
    expect(lightSyntaxProblems('x{instance=~"$instance"}')).not.toEqual([])
  })
})

describe('PromQL in the alert rules and the Grafana dashboard', () => {
  let known: Record<Job, Set<string>>

  beforeAll(async () => {
    known = await registeredSeries()
  })

  it('finds every expression, each reading at least one metric', () => {
    expect(ruleExpressions().length).toBeGreaterThanOrEqual(9)
    expect(dashboardExpressions().length).toBeGreaterThanOrEqual(20)
    for (const expression of expressions) {
      expect(metricNames(expression.promql).length, expression.where).toBeGreaterThan(0)
      expect(metricNames(expression.promql), `${expression.where}: a selector without a metric name`).not.toContain('')
    }
  })

  const tool = promtool()
  it(tool ? 'every expression parses (promtool check rules)' : `every expression passes the light syntax check (${PROMTOOL_MISSING})`, () => {
    if (!tool) {
      console.warn(`PromQL parsed by a light syntax check only: ${PROMTOOL_MISSING}`)
      for (const expression of expressions) expect(lightSyntaxProblems(expression.promql), expression.where).toEqual([])
      return
    }
    expect(promtoolParse(expressions)).toEqual([])
  })

  it('names only metrics the services register (for the job it selects), or Prometheus\' own up', () => {
    const unknown: string[] = []
    for (const expression of expressions) {
      for (const selector of selectors(expression.promql)) {
        if (PROMETHEUS_SYNTHETIC.has(selector.metric)) continue
        const jobs = jobsOf(selector)
        if (jobs.length === 0) unknown.push(`${expression.where}: ${selector.metric} selects no service's job`)
        // A selector without job="…" must exist somewhere; one pinned to jobs must exist in each.
        const pinned = selector.matchers.some((matcher) => matcher.label === 'job')
        const exists = pinned ? jobs.every((job) => known[job].has(selector.metric)) : jobs.some((job) => known[job].has(selector.metric))
        if (!exists) unknown.push(`${expression.where}: ${selector.metric} (job ${jobs.join('|')})`)
      }
    }
    expect(unknown).toEqual([])
  })

  it('the dashboard shows what operators need', () => {
    const all = dashboardExpressions().map((expression) => expression.promql)
    const some = (test: (promql: string) => boolean) => all.some(test)
    expect(some((e) => e.includes('http_requests_total') && groupingLabels(e).includes('status_class')), 'traffic by status').toBe(true)
    expect(some((e) => e.includes('gateway_rate_limit_requests_total') && groupingLabels(e).includes('plan')), 'traffic by plan').toBe(true)
    for (const quantile of ['0.5', '0.99']) {
      expect(some((e) => e.startsWith(`histogram_quantile(${quantile},`) && e.includes('http_request_duration_seconds_bucket')), `p${quantile}`).toBe(true)
      expect(some((e) => e.startsWith(`histogram_quantile(${quantile},`) && e.includes('gateway_rate_limit_store_duration_seconds_bucket')), `Redis p${quantile}`).toBe(true)
    }
    expect(some((e) => /outcome=~"limited\|banned"/.test(e)), '429s').toBe(true)
    expect(some((e) => e.includes('gateway_bans_total')), 'bans').toBe(true)
    expect(some((e) => e.includes('gateway_active_bans')), 'active bans').toBe(true)
    expect(some((e) => e.includes('gateway_upstream_errors_total')), 'upstream errors').toBe(true)
    expect(some((e) => e.includes('gateway_rate_limit_store_errors_total')), 'Redis errors').toBe(true)
    expect(some((e) => e.includes('result="hit"') && e.includes('/ sum(rate(gateway_key_cache_lookups_total')), 'key-cache hit ratio').toBe(true)
    expect(some((e) => e.includes('gateway_config_reloads_total')), 'config reloads').toBe(true)
  })
})
