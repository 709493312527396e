/**
 * Statistics for the timing test (keyTiming.int.test.ts): robust to a loaded machine, because
 * the groups are sampled interleaved (load hits every group alike) and compared by rank and by
 * median, never by mean.
 */

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = sorted.length >> 1
  return sorted.length % 2 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
}

/**
 * Mann–Whitney U as a z-score (normal approximation, tie-corrected): positive when `b` tends to
 * be larger than `a`. Under "same distribution" |z| above 4.5 happens about once in 150,000.
 */
export function mannWhitneyZ(a: readonly number[], b: readonly number[]): number {
  const all = [...a.map((value) => ({ value, fromB: false })), ...b.map((value) => ({ value, fromB: true }))].sort(
    (x, y) => x.value - y.value,
  )
  const n = all.length
  let rankSumB = 0
  let tieTerm = 0
  for (let start = 0; start < n; ) {
    let end = start
    while (end + 1 < n && all[end + 1]!.value === all[start]!.value) end++
    const rank = (start + end) / 2 + 1
    const ties = end - start + 1
    tieTerm += ties ** 3 - ties
    for (let i = start; i <= end; i++) if (all[i]!.fromB) rankSumB += rank
    start = end + 1
  }
  const [na, nb] = [a.length, b.length]
  const u = rankSumB - (nb * (nb + 1)) / 2
  const mean = (na * nb) / 2
  const variance = ((na * nb) / 12) * (n + 1 - tieTerm / (n * (n - 1)))
  return variance === 0 ? 0 : (u - mean) / Math.sqrt(variance)
}

export interface GroupComparison {
  group: string
  medianMicros: number
  /** Median of this group minus the baseline's. */
  shiftMicros: number
  z: number
  /** Both significant by rank and larger than the tolerance: the time depends on the group. */
  differs: boolean
}

export interface Tolerance {
  /** |z| above which the rank test calls two groups different. */
  zLimit: number
  /** A median shift below this many µs is noise on a loaded machine, whatever the rank test says. */
  minShiftMicros: number
  /** …or below this fraction of the baseline's median. */
  relativeShift: number
}

export const LOADED_MACHINE: Tolerance = { zLimit: 4.5, minShiftMicros: 100, relativeShift: 0.1 }

/** Each group against the baseline group: a group differs when both tests say so. */
export function compareWithBaseline(
  samples: ReadonlyMap<string, readonly number[]>,
  baseline: string,
  tolerance: Tolerance = LOADED_MACHINE,
): GroupComparison[] {
  const reference = samples.get(baseline)
  if (!reference) throw new Error(`no baseline group ${baseline}`)
  const referenceMedian = median(reference)
  const allowed = Math.max(tolerance.minShiftMicros, tolerance.relativeShift * referenceMedian)
  return [...samples].map(([group, values]) => {
    const medianMicros = median(values)
    const shiftMicros = medianMicros - referenceMedian
    const z = mannWhitneyZ(reference, values)
    return { group, medianMicros, shiftMicros, z, differs: Math.abs(z) > tolerance.zLimit && Math.abs(shiftMicros) > allowed }
  })
}
