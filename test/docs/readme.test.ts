import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { gatewayErrors } from '../../gateway/src/errors.ts'
import { petsErrors } from '../../pets-service/src/errors.ts'

const readme = readFileSync('README.md', 'utf8')

/** The `| code | status | when |` rows of the table that follows `heading`. */
function errorTable(heading: string): Map<string, number> {
  const start = readme.indexOf(heading)
  expect(start, `README has "${heading}"`).toBeGreaterThan(-1)
  const rows = new Map<string, number>()
  for (const line of readme.slice(start + heading.length).split('\n').slice(1)) {
    if (line.trim() === '') {
      if (rows.size > 0) break
      continue
    }
    const match = /^\| `([a-z_]+)` \| (\d{3}) \|/.exec(line)
    if (match) rows.set(match[1]!, Number(match[2]))
  }
  return rows
}

describe('README', () => {
  it.each([
    ['Answered by the gateway:', gatewayErrors],
    ['Answered by the pets-service and passed through unchanged:', petsErrors],
  ])('lists exactly the error codes %s, with their statuses', (heading, catalogue) => {
    const documented = errorTable(heading)
    const declared = new Map(catalogue.codes().map((code) => [code, (catalogue as unknown as Record<string, { status: number }>)[code]!.status]))
    expect(documented).toEqual(declared)
  })
})
