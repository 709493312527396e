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
