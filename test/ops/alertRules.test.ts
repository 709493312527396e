import { readFileSync } from 'node:fs'
import { parse } from 'yaml'
import { describe, expect, it } from 'vitest'
import { ALERTS_FILE, ALERT_TESTS_FILE, PROMETHEUS_DIR, PROMTOOL_MISSING, alertRules, promtool, runPromtool } from './promql.ts'

/** The alerts operators were promised (see the README's alert list), by what they watch. */
const REQUIRED_ALERTS = {
  HighServerErrorRatio: '5xx ratio',
  UpstreamErrors: 'upstream down: failed upstream calls',
  UpstreamSaturated: 'upstream hung or slow: requests outstanding near maxInFlight',
  ConnectionsNearCap: 'connection flood or too small a cap: connections held near the cap',
  ConnectionsRefused: 'connections closed unread at the cap',
  ServiceDown: 'upstream (pets-service) or gateway down: scrape fails',
  RateLimitStoreErrors: 'Redis errors',
  RateLimitStoreUnavailable: 'Redis down with onStoreFailure closed',
  RateLimitedSurge: '429 surge',
  BanSurge: 'ban surge',
  HighLatencyP99: 'p99 latency',
  ConfigReloadFailed: 'config reload failures',
  TlsCertificateExpiresSoon: 'the gateway\'s own certificate near its end',
  TlsReloadFailed: 'certificate rotation refused',
}

interface RuleTestFile {
  rule_files: string[]
  tests: { name: string; alert_rule_test?: { alertname: string; eval_time: string; exp_alerts?: unknown[] }[] }[]
}

describe('alert rules (config/prometheus/alerts.yml)', () => {
  const rules = parse(readFileSync(ALERTS_FILE, 'utf8')) as {
    groups: { name: string; rules: { alert: string; expr: string; labels?: Record<string, string>; annotations?: Record<string, string> }[] }[]
  }
  const all = rules.groups.flatMap((group) => group.rules)

  it('has exactly the promised alerts, each with a severity, a summary and a description', () => {
    expect(alertRules().map((rule) => rule.alert).sort()).toEqual(Object.keys(REQUIRED_ALERTS).sort())
    for (const rule of all) {
      expect(['warning', 'critical'], rule.alert).toContain(rule.labels?.severity)
      expect(rule.annotations?.summary, rule.alert).toBeTruthy()
      expect(rule.annotations?.description, rule.alert).toBeTruthy()
    }
  })

  it('has a promtool unit test where each alert fires and one where it stays quiet', () => {
    const tests = parse(readFileSync(ALERT_TESTS_FILE, 'utf8')) as RuleTestFile
    expect(tests.rule_files).toEqual(['../alerts.yml'])
    const cases = tests.tests.flatMap((test) => test.alert_rule_test ?? [])
    for (const alert of Object.keys(REQUIRED_ALERTS)) {
      const mine = cases.filter((entry) => entry.alertname === alert)
      expect(mine.some((entry) => (entry.exp_alerts ?? []).length > 0), `${alert} fires in a test`).toBe(true)
      expect(mine.some((entry) => (entry.exp_alerts ?? []).length === 0), `${alert} stays quiet in a test`).toBe(true)
    }
  })

  const tool = promtool()
  const skipped = tool ? '' : ` (skipped: ${PROMTOOL_MISSING})`
  if (!tool) console.warn(`promtool tests skipped: ${PROMTOOL_MISSING}`)

  it.skipIf(!tool)(`promtool check config accepts the compose scrape config and its rule files${skipped}`, () => {
    const result = runPromtool(['check', 'config', `${PROMETHEUS_DIR}/prometheus.yml`])
    expect(result.status, result.output).toBe(0)
    expect(result.output).toMatch(/SUCCESS: 1 rule files found/)
  })

  it.skipIf(!tool)(`promtool test rules passes every alert unit test${skipped}`, () => {
    const result = runPromtool(['test', 'rules', ALERT_TESTS_FILE])
    expect(result.status, result.output).toBe(0)
    expect(result.output).toMatch(/SUCCESS/)
  })
})
