import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

/**
 * `npm run reliability-table`: renders the scenario records the suite wrote
 * (test/helpers/scenarioLog.ts, test-results/reliability/*.jsonl) into the README's Reliability
 * section, between the markers below. `--print` writes the section to stdout and leaves the
 * README alone (what .ci/run does after `npm test`).
 *
 * A row appears only while the test file it names still records it: a record whose file is gone,
 * or no longer holds the scenario's text, is dropped (and named on stderr). The same rule checks
 * the README in test/scripts/reliabilityTable.test.ts, so a removed test cannot leave a stale row.
 */

export const BEGIN_MARKER = '<!-- reliability:begin -->'
export const END_MARKER = '<!-- reliability:end -->'
export const COMMAND = 'npm run reliability-table'

/** Areas in the order the README shows them; any other area follows, alphabetically. */
export const AREA_ORDER = ['Redis', 'Postgres', 'pets-service', 'Gateway', 'Load', 'Hostile input', 'Security']

export interface ScenarioRow {
  area: string
  scenario: string
  answered: string
  lost: string
  test: string
  recordedAt: string
  /** The records file (one per test worker process, so one per run of a test file). */
  batch?: string
}

const ROOT = fileURLToPath(new URL('../', import.meta.url))
export const DEFAULT_RECORDS_DIRECTORY = path.join(ROOT, 'test-results/reliability')

function isRow(value: unknown): value is ScenarioRow {
  if (typeof value !== 'object' || value === null) return false
  const record = value as Record<string, unknown>
  return ['area', 'scenario', 'answered', 'lost', 'test', 'recordedAt'].every((field) => typeof record[field] === 'string')
}

/** Every record in the directory's *.jsonl files; a line that is not a record is skipped. */
export function readRecords(directory: string): ScenarioRow[] {
  if (!existsSync(directory)) return []
  const rows: ScenarioRow[] = []
  for (const file of readdirSync(directory).filter((name) => name.endsWith('.jsonl')).sort()) {
    for (const line of readFileSync(path.join(directory, file), 'utf8').split('\n')) {
      if (line.trim() === '') continue
      try {
        const parsed: unknown = JSON.parse(line)
        if (isRow(parsed)) rows.push({ ...parsed, batch: file })
      } catch {
        // A line cut short by a killed worker: not a record.
      }
    }
  }
  return rows
}

const rowKey = (row: Pick<ScenarioRow, 'area' | 'scenario' | 'test'>) => `${row.area}\u0000${row.scenario}\u0000${row.test}`

/** One row per (area, scenario, test): the latest record wins (a later run replaces an earlier one). */
export function latestRows(records: ScenarioRow[]): ScenarioRow[] {
  const latest = new Map<string, ScenarioRow>()
  for (const record of records) {
    const known = latest.get(rowKey(record))
    if (!known || known.recordedAt <= record.recordedAt) latest.set(rowKey(record), record)
  }
  return [...latest.values()]
}

function areaRank(area: string): number {
  const index = AREA_ORDER.indexOf(area)
  return index === -1 ? AREA_ORDER.length : index
}

/** Areas in AREA_ORDER, then alphabetically; within an area by test file, then scenario. */
export function sortRows(rows: ScenarioRow[]): ScenarioRow[] {
  return [...rows].sort(
    (a, b) =>
      areaRank(a.area) - areaRank(b.area) ||
      a.area.localeCompare(b.area) ||
      a.test.localeCompare(b.test) ||
      a.scenario.localeCompare(b.scenario),
  )
}

/** Template literals need this much literal text to stand for a scenario (`${a}: ${b}` stands for nothing). */
const TEMPLATE_LITERAL_MIN = 15

/**
 * What in the test file's source produces this scenario text, or undefined when nothing does: the
 * text as a literal anywhere in the file (a recordScenario argument, an it.each table, a helper's
 * argument), or a template literal whose `${…}` parts stand for anything. The file must call
 * recordScenario at all. Records matching the same template are one row (the latest).
 */
export function sourcePattern(source: string, scenario: string): string | undefined {
  if (!source.includes('recordScenario(')) return undefined
  if (source.includes(scenario)) return scenario
  for (const match of source.matchAll(/`((?:[^`\\]|\\.)*)`/g)) {
    const template = match[1]!
    if (!template.includes('${')) continue
    const literals = template.split(/\$\{[^}]*\}/)
    if (literals.join('').length < TEMPLATE_LITERAL_MIN) continue
    const pattern = literals.map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*')
    if (new RegExp(`^${pattern}$`, 's').test(scenario)) return template
  }
  return undefined
}

export function sourceRecords(source: string, scenario: string): boolean {
  return sourcePattern(source, scenario) !== undefined
}

function testSource(test: string, root: string): string | undefined {
  const file = path.join(root, test)
  return test.startsWith('test/') && existsSync(file) ? readFileSync(file, 'utf8') : undefined
}

/** Whether `row.test` exists under `root` and still records `row.scenario`. */
export function isBackedBySource(row: Pick<ScenarioRow, 'scenario' | 'test'>, root = ROOT): boolean {
  const source = testSource(row.test, root)
  return source !== undefined && sourceRecords(source, row.scenario)
}

/** A table cell: one line, pipes escaped. */
export function cell(text: string): string {
  return text.replace(/\s*\n\s*/g, ' ').replace(/\|/g, '\\|').trim()
}

/** The cells of one Markdown table line, unescaped (the inverse of `cell`). */
export function cellsOf(line: string): string[] {
  const inner = line.trim().replace(/^\|/, '').replace(/\|$/, '')
  return inner.split(/(?<!\\)\|/).map((part) => part.trim().replace(/\\\|/g, '|'))
}

const utc = (iso: string) => `${iso.slice(0, 16).replace('T', ' ')} UTC`

/** The section between the markers (markers included). */
export function renderSection(rows: ScenarioRow[], generatedAt: Date): string {
  const sorted = sortRows(rows)
  const lines = [BEGIN_MARKER]
  if (sorted.length === 0) {
    lines.push('', `No scenario has been recorded yet: run \`npm test\`, then \`${COMMAND}\`.`, '', END_MARKER)
    return lines.join('\n')
  }
  const times = sorted.map((row) => row.recordedAt).sort()
  lines.push(
    '',
    `Generated by \`${COMMAND}\` on ${utc(generatedAt.toISOString())} from what \`npm test\` recorded ` +
      `between ${utc(times[0]!)} and ${utc(times.at(-1)!)}: ${sorted.length} scenarios, each row written by the ` +
      'named test after its assertions passed.',
  )
  let area: string | undefined
  for (const row of sorted) {
    if (row.area !== area) {
      area = row.area
      lines.push('', `### ${area}`, '', '| scenario | answered | lost | test |', '|---|---|---|---|')
    }
    lines.push(`| ${cell(row.scenario)} | ${cell(row.answered)} | ${cell(row.lost)} | \`${cell(row.test)}\` |`)
  }
  lines.push('', END_MARKER)
  return lines.join('\n')
}

/** The README with its section replaced; the markers must be there, once each, in order. */
export function replaceSection(readme: string, section: string): string {
  const begin = readme.indexOf(BEGIN_MARKER)
  const end = readme.indexOf(END_MARKER)
  if (begin === -1 || end === -1 || end < begin || readme.indexOf(BEGIN_MARKER, begin + 1) !== -1) {
    throw new Error(`README.md needs exactly one ${BEGIN_MARKER} … ${END_MARKER} pair`)
  }
  return readme.slice(0, begin) + section + readme.slice(end + END_MARKER.length)
}

/** The rows a README section lists, with their area (from the `### area` heading above them). */
export function readmeRows(readme: string): Pick<ScenarioRow, 'area' | 'scenario' | 'answered' | 'lost' | 'test'>[] {
  const begin = readme.indexOf(BEGIN_MARKER)
  const end = readme.indexOf(END_MARKER)
  if (begin === -1 || end < begin) return []
  const rows: Pick<ScenarioRow, 'area' | 'scenario' | 'answered' | 'lost' | 'test'>[] = []
  let area = ''
  for (const line of readme.slice(begin, end).split('\n')) {
    const heading = /^### (.+)$/.exec(line)
    if (heading) area = heading[1]!.trim()
    if (!line.startsWith('| ') || line.startsWith('| scenario |')) continue
    const [scenario = '', answered = '', lost = '', test = ''] = cellsOf(line)
    rows.push({ area, scenario, answered, lost, test: test.replace(/^`|`$/g, '') })
  }
  return rows
}

export interface Rendered {
  section: string
  rows: ScenarioRow[]
  dropped: ScenarioRow[]
}

export function render(recordsDirectory = DEFAULT_RECORDS_DIRECTORY, generatedAt = new Date(), root = ROOT): Rendered {
  const all = latestRows(readRecords(recordsDirectory))
  const dropped: ScenarioRow[] = []
  // Rows from one source pattern (a templated scenario) come from the latest run of their test
  // only: a scenario whose text carries a setting (`for 12 s`, soak sizes) is not listed twice,
  // while the cases of one run (`sent to the gateway`, `…to the pets-service`) all are.
  const byPattern = new Map<string, ScenarioRow[]>()
  for (const row of all) {
    const source = testSource(row.test, root)
    const pattern = source === undefined ? undefined : sourcePattern(source, row.scenario)
    if (pattern === undefined) {
      dropped.push(row)
      continue
    }
    const key = `${row.area}\u0000${row.test}\u0000${pattern}`
    byPattern.set(key, [...(byPattern.get(key) ?? []), row])
  }
  const rows: ScenarioRow[] = []
  for (const group of byPattern.values()) {
    const latest = group.reduce((a, b) => (b.recordedAt >= a.recordedAt ? b : a))
    rows.push(...group.filter((row) => row.batch === latest.batch))
  }
  return { section: renderSection(rows, generatedAt), rows, dropped }
}

function main(argv: string[]): void {
  const print = argv.includes('--print')
  const recordsAt = argv.indexOf('--records')
  const { section, rows, dropped } = render(recordsAt >= 0 ? path.resolve(argv[recordsAt + 1] ?? '') : undefined)
  for (const row of dropped) console.error(`dropped (its test no longer records it): ${row.test}: ${row.scenario}`)
  if (print) {
    console.log(section)
    return
  }
  // A fresh clone has no records (test-results/ is not committed): keep the README's table.
  if (rows.length === 0) {
    console.error(`no scenario records in test-results/reliability: run \`npm test\` first; README.md left as it is`)
    process.exitCode = 1
    return
  }
  const readmePath = path.join(ROOT, 'README.md')
  writeFileSync(readmePath, replaceSection(readFileSync(readmePath, 'utf8'), section))
  console.log(`README.md: Reliability table with ${rows.length} scenarios`)
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main(process.argv.slice(2))
