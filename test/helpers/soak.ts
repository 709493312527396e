import type { ScenarioRecord } from './scenarioLog.ts'

/**
 * `npm run soak` sets SOAK=1: the reliability load and slow-client tests then run their longer
 * variants (more keys, longer load, more idle connections). `npm test` runs the short ones.
 */
export const SOAK = process.env.SOAK === '1'

/** `normal` in `npm test`, `soak` under `npm run soak`. */
export function scaled<T>(normal: T, soak: T): T {
  return SOAK ? soak : normal
}

/** Nearest-rank percentile of `values` (0–100); NaN when empty. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!
}

/**
 * Under `npm run soak`, which records nothing in the README's table, prints a scenario record
 * so the soak's numbers are seen; returns it for recordScenario either way.
 */
export function printedInSoak(record: ScenarioRecord): ScenarioRecord {
  if (SOAK) console.info(`[soak] ${record.scenario}\n  answered: ${record.answered}\n  lost: ${record.lost}`)
  return record
}

/** Largest and smallest of many values (spreading 100,000 arguments into Math.max can overflow the stack). */
export const maxOf = (values: readonly number[]): number => values.reduce((most, value) => Math.max(most, value), -Infinity)
export const minOf = (values: readonly number[]): number => values.reduce((least, value) => Math.min(least, value), Infinity)
