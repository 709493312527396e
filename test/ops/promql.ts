import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { parse } from 'yaml'
import type { Job } from './exportedSeries.ts'

export const PROMETHEUS_DIR = 'config/prometheus'
export const ALERTS_FILE = `${PROMETHEUS_DIR}/alerts.yml`
export const ALERT_TESTS_FILE = `${PROMETHEUS_DIR}/tests/alerts.test.yml`
export const DASHBOARD_FILE = 'config/grafana/dashboards/gateway.json'

/** One PromQL expression, where it came from, and the text Prometheus would evaluate. */
export interface Expression {
  where: string
  /** As written (a dashboard's may hold Grafana variables). */
  raw: string
  /** Grafana variables replaced by values Prometheus accepts. */
  promql: string
}

interface RuleFile {
  groups: { name: string; rules: { alert?: string; record?: string; expr: string; for?: string }[] }[]
}

export function alertRules(): { alert: string; expr: string }[] {
  const file = parse(readFileSync(ALERTS_FILE, 'utf8')) as RuleFile
  return file.groups.flatMap((group) => group.rules.map((rule) => ({ alert: rule.alert ?? rule.record ?? '?', expr: rule.expr })))
}

export function ruleExpressions(): Expression[] {
  return alertRules().map((rule) => ({ where: `${ALERTS_FILE} ${rule.alert}`, raw: rule.expr, promql: rule.expr.trim() }))
}

/**
 * Grafana's built-in interval variables become fixed durations and a template variable (used
 * only inside regex matchers here) becomes ".*", which is what "All" sends.
 */
export function substituteGrafanaVariables(expr: string): string {
  return expr
    .replace(/\$__rate_interval|\$__interval|\$\{__rate_interval\}|\$\{__interval\}/g, '1m')
    .replace(/\$__range|\$\{__range\}/g, '1h')
    .replace(/\$\{?[A-Za-z_]\w*\}?/g, '.*')
}

interface Panel {
  title?: string
  type?: string
  targets?: { refId?: string; expr?: string; legendFormat?: string }[]
  panels?: Panel[]
}

export interface Dashboard {
  uid: string
  title: string
  panels: Panel[]
  templating?: { list: { name: string; type: string; query?: string | { query: string }; datasource?: unknown }[] }
}

export function dashboard(): Dashboard {
  return JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as Dashboard
}

export function dashboardPanels(board: Dashboard = dashboard()): Panel[] {
  return board.panels.flatMap((panel) => [panel, ...(panel.panels ?? [])]).filter((panel) => panel.type !== 'row')
}

/** Every target expression of every panel, and the series selector inside each query variable. */
export function dashboardExpressions(board: Dashboard = dashboard()): Expression[] {
  const found: Expression[] = []
  for (const panel of dashboardPanels(board)) {
    for (const target of panel.targets ?? []) {
      if (!target.expr) continue
      found.push({ where: `${DASHBOARD_FILE} "${panel.title}" ${target.refId}`, raw: target.expr, promql: substituteGrafanaVariables(target.expr) })
    }
  }
  for (const variable of board.templating?.list ?? []) {
    if (variable.type !== 'query') continue
    const query = typeof variable.query === 'string' ? variable.query : (variable.query?.query ?? '')
    // label_values(<selector>, label) is Grafana's, not PromQL; the selector inside is PromQL.
    const inner = /^label_values\((.*),\s*\w+\)$/.exec(query.trim())?.[1] ?? query
    found.push({ where: `${DASHBOARD_FILE} variable $${variable.name}`, raw: query, promql: substituteGrafanaVariables(inner) })
  }
  return found
}

const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'inf', 'nan', 'by', 'without', 'on', 'ignoring', 'group_left', 'group_right'])

/** A series selector: metric name, and the label matchers written with it. */
export interface Selector {
  metric: string
  matchers: { label: string; op: string; value: string }[]
}

/**
 * The series selectors of a PromQL expression, without a full parser: strings, label matchers,
 * range and grouping clauses are set aside, and what remains that is an identifier not called as
 * a function and not a keyword is a metric name. promtool checks the syntax; this only reads.
 */
export function selectors(promql: string): Selector[] {
  const found: Selector[] = []
  const withBraces = /([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}/g
  let text = promql
  for (const match of promql.matchAll(withBraces)) {
    const matchers = [...match[2]!.matchAll(/([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"/g)].map((m) => ({
      label: m[1]!,
      op: m[2]!,
      value: m[3]!,
    }))
    if (match[1] && !KEYWORDS.has(match[1])) found.push({ metric: match[1], matchers })
    else found.push({ metric: '', matchers })
  }
  text = text
    .replace(withBraces, ' ')
    .replace(/"(?:[^"\\]|\\.)*"/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\boffset\s+-?\w+/g, ' ')
  for (const match of text.matchAll(/(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()/g)) {
    const name = match[1]!
    if (KEYWORDS.has(name.toLowerCase()) || /^\d/.test(name)) continue
    found.push({ metric: name, matchers: [] })
  }
  return found
}

/** Labels named in grouping clauses: by (…), without (…), on (…), ignoring (…), group_*(…). */
export function groupingLabels(promql: string): string[] {
  return [...promql.matchAll(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g)].flatMap((match) =>
    match[1]!
      .split(',')
      .map((label) => label.trim())
      .filter(Boolean),
  )
}

/** Names of the metrics an expression reads. */
export function metricNames(promql: string): string[] {
  return [...new Set(selectors(promql).map((selector) => selector.metric))]
}

/**
 * A light syntax check for machines without promtool: balanced brackets outside strings,
 * closed strings, no Grafana variable left, something to evaluate. Not a parser.
 */
export function lightSyntaxProblems(promql: string): string[] {
  const problems: string[] = []
  const stack: string[] = []
  const pairs: Record<string, string> = { ')': '(', ']': '[', '}': '{' }
  let inString = false
  for (let i = 0; i < promql.length; i++) {
    const char = promql[i]!
    if (inString) {
      if (char === '\\') i++
      else if (char === '"') inString = false
      continue
    }
    if (char === '"') inString = true
    else if ('([{'.includes(char)) stack.push(char)
    else if (char in pairs && stack.pop() !== pairs[char]) problems.push(`unbalanced "${char}" at ${i}`)
  }
  if (inString) problems.push('unclosed string')
  if (stack.length > 0) problems.push(`unclosed "${stack.join('')}"`)
  if (/\$/.test(promql)) problems.push('a Grafana variable is left')
  if (promql.trim() === '') problems.push('empty')
  if (/\b(rate|increase|irate|delta|deriv)\s*\((?![^()]*\[)/.test(promql)) problems.push('a range function without a range')
  return problems
}

/** promtool when it is on PATH, else undefined. */
export function promtool(): string | undefined {
  const probe = spawnSync('promtool', ['--version'], { encoding: 'utf8' })
  return probe.status === 0 ? 'promtool' : undefined
}

export const PROMTOOL_MISSING =
  'promtool is not on PATH: Debian `apt-get install prometheus` provides it (.ci/run installs it)'

export function runPromtool(args: string[], input?: string): { status: number | null; output: string } {
  const result = spawnSync('promtool', args, { encoding: 'utf8', input, timeout: 30_000 })
  return { status: result.status, output: `${result.stdout}${result.stderr}` }
}

/**
 * Parses expressions with promtool by writing them as recording rules into a temporary rules
 * file and running `promtool check rules` on it; one file per expression so a failure names it.
 */
export function promtoolParse(expressions: Expression[]): { where: string; output: string }[] {
  const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-promql-'))
  try {
    const files = expressions.map((expression, index) => {
      const file = path.join(directory, `expr-${index}.yml`)
      const rules = { groups: [{ name: 'parse', rules: [{ record: `parse:expr_${index}`, expr: expression.promql }] }] }
      writeFileSync(file, JSON.stringify(rules))
      return file
    })
    const all = runPromtool(['check', 'rules', ...files])
    if (all.status === 0) return []
    // Name the culprits.
    return expressions.flatMap((expression, index) => {
      const one = runPromtool(['check', 'rules', files[index]!])
      return one.status === 0 ? [] : [{ where: expression.where, output: one.output }]
    })
  } finally {
    rmSync(directory, { recursive: true, force: true })
  }
}

/** The services' jobs a selector can match: those its job matcher allows, or both without one. */
export function jobsOf(selector: Selector): Job[] {
  const job = selector.matchers.find((matcher) => matcher.label === 'job')
  if (!job) return ['gateway', 'pets-service']
  const pattern = new RegExp(`^(?:${job.op.includes('~') ? job.value : job.value.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')})$`)
  const matching = (['gateway', 'pets-service'] as Job[]).filter((name) => pattern.test(name) !== job.op.startsWith('!'))
  return matching
}
