import { readFileSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { describe, expect, it } from 'vitest'
import { gatewayErrors } from '../../gateway/src/errors.ts'
import { petsErrors } from '../../pets-service/src/errors.ts'

const readme = readFileSync('README.md', 'utf8')
const DELIMITER_ROW = /^\|[\s:|-]+\|$/
const DOCS = ['README.md', ...readdirSync('docs').filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`)]

/** The rows of the first table after `heading` (which may be its header row), below its delimiter row. */
function tableAfter(heading: string): string[] {
  const start = readme.indexOf(heading)
  expect(start, `README has "${heading}"`).toBeGreaterThan(-1)
  const rows: string[] = []
  for (const line of readme.slice(start + heading.length).split('\n').slice(1)) {
    if (line.trim() === '') {
      if (rows.length > 0) break
      continue
    }
    if (line.startsWith('|')) rows.push(line)
  }
  return rows.slice(rows.findIndex((row) => DELIMITER_ROW.test(row)) + 1)
}

/** The `| code | status | when |` rows of the table that follows `heading`. */
function errorTable(heading: string): Map<string, number> {
  const rows = new Map<string, number>()
  for (const line of tableAfter(heading)) {
    const match = /^\| `([a-z_]+)` \| (\d{3}) \|/.exec(line)
    if (match) rows.set(match[1]!, Number(match[2]))
  }
  return rows
}

/** The `backticked` names in the first column of the table that follows `heading`. */
function firstColumnNames(heading: string, name: RegExp): string[] {
  return tableAfter(heading).flatMap((line) => [...line.split('|')[1]!.matchAll(new RegExp(`\`(${name.source})\``, 'g'))].map((match) => match[1]!))
}

function sourceFiles(directory: string): string[] {
  return readdirSync(directory).flatMap((name) => {
    const path = join(directory, name)
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith('.ts') ? [path] : []
  })
}

const CODE = ['common/src', 'gateway/src', 'pets-service/src', 'scripts'].flatMap(sourceFiles).map((path) => ({ path, text: readFileSync(path, 'utf8') }))

/** Every way the code reads a variable: `env.NAME`, `env['NAME']`, the env.ts helpers, a listener's `hostVariable`/`portVariable`. */
const ENV_READS = [
  /\benv\.([A-Z][A-Z0-9_]*)\b/g,
  /\benv\[['"]([A-Z][A-Z0-9_]*)['"]\]/g,
  /(?:FromEnv|requiredEnv)\(\s*'([A-Z][A-Z0-9_]*)'/g,
  /Variable: '([A-Z][A-Z0-9_]*)'/g,
]
/** Read by the code but set by npm, not by an operator. */
const NPM_VARIABLES = new Set(['INIT_CWD'])

describe('README', () => {
  it.each([
    ['Answered by the gateway:', gatewayErrors],
    ['Answered by the pets-service and passed through unchanged:', petsErrors],
  ])('lists exactly the error codes %s, with their statuses', (heading, catalogue) => {
    const documented = errorTable(heading)
    const declared = new Map(catalogue.codes().map((code) => [code, (catalogue as unknown as Record<string, { status: number }>)[code]!.status]))
    expect(documented).toEqual(declared)
  })

  it.each(DOCS)('%s: every table row is part of its table (a blank line inside one shows the rest as text)', (file) => {
    const lines = readFileSync(file, 'utf8').split('\n')
    let fenced = false
    const strays: string[] = []
    lines.forEach((line, index) => {
      if (line.startsWith('```')) fenced = !fenced
      if (fenced || !line.startsWith('|')) return
      const inTable = lines[index - 1]?.startsWith('|') || DELIMITER_ROW.test(lines[index + 1] ?? '')
      if (!inTable) strays.push(`${file}:${index + 1}: ${line.slice(0, 60)}`)
    })
    expect(strays).toEqual([])
  })

  it('documents exactly the environment variables the services, the CLIs and npm start read', () => {
    const read = new Set<string>()
    for (const { text } of CODE) {
      for (const pattern of ENV_READS) for (const match of text.matchAll(pattern)) if (!NPM_VARIABLES.has(match[1]!)) read.add(match[1]!)
    }
    const documented = firstColumnNames('### Environment variables', /[A-Z][A-Z0-9_]+/)
    expect([...new Set(documented)].sort()).toEqual([...read].sort())
  })

  it('lists exactly the metric families the services declare', () => {
    const declared = new Set(CODE.flatMap(({ text }) => [...text.matchAll(/\bname: '((?:http|gateway|pg)_[a-z0-9_]+)'/g)].map((match) => match[1]!)))
    const documented = firstColumnNames('**Metrics.**', /(?:http|gateway|pg)_[a-z0-9_]+/)
    expect([...new Set(documented)].sort()).toEqual([...declared].sort())
  })

  it('lists exactly the alerts of config/prometheus/alerts.yml', () => {
    const rules = [...readFileSync('config/prometheus/alerts.yml', 'utf8').matchAll(/^\s*- alert: (\w+)$/gm)].map((match) => match[1]!)
    expect(firstColumnNames('| alert | fires when |', /\w+/).sort()).toEqual(rules.sort())
  })
})
