import { appendFileSync, mkdirSync } from 'node:fs'
import path from 'node:path'

/**
 * The README's Reliability table is generated from what the suite itself saw. A test that proves a
 * fault, load or hostile-input scenario calls `recordScenario` once its assertions have passed, with
 * what it did and what it measured; `npm run reliability-table` renders the records into the README.
 * Records go to test-results/reliability/<pid>.jsonl (one file per worker, so parallel workers never
 * interleave a line); nothing is written when RELIABILITY_RECORDS is "off".
 */
export interface ScenarioRecord {
  /** The table's group: 'Redis', 'pets-service', 'Postgres', 'Gateway', 'Load', 'Hostile input', 'Security'. */
  area: string
  /** What was done, in a user's words: "Redis frozen with SIGSTOP while requests arrive". */
  scenario: string
  /** What the system answered, with the measured numbers: "200 within 61 ms (budget 50 ms + slack)". */
  answered: string
  /** What was lost, with the evidence: "nothing: 100 admitted of 100, every row present". */
  lost: string
  /** The test file that proved it, relative to the repository root. */
  test: string
}

export const SCENARIO_RECORDS_DIRECTORY = path.resolve(import.meta.dirname, '../../test-results/reliability')

export function recordScenario(record: ScenarioRecord): void {
  if (process.env.RELIABILITY_RECORDS === 'off') return
  mkdirSync(SCENARIO_RECORDS_DIRECTORY, { recursive: true })
  const line = JSON.stringify({ ...record, recordedAt: new Date().toISOString() })
  appendFileSync(path.join(SCENARIO_RECORDS_DIRECTORY, `${process.pid}.jsonl`), `${line}\n`)
}
