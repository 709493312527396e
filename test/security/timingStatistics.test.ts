import { describe, expect, it } from 'vitest'
import { compareWithBaseline, mannWhitneyZ, median } from './timingStatistics.ts'

/** Deterministic heavy-tailed "latencies": a loaded machine's spikes included. */
function latencies(count: number, seed: number, shift = 0): number[] {
  let state = seed
  const next = () => ((state = (state * 1_103_515_245 + 12_345) % 2_147_483_648) / 2_147_483_648)
  return Array.from({ length: count }, () => 300 + shift + 200 * next() + (next() < 0.05 ? 5_000 * next() : 0))
}

describe('the timing test statistics', () => {
  it('computes medians and a rank z-score with its sign', () => {
    expect(median([5, 1, 3])).toBe(3)
    expect(median([4, 1, 3, 2])).toBe(2.5)
    expect(mannWhitneyZ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])).toBeCloseTo(0)
    expect(mannWhitneyZ(latencies(200, 1), latencies(200, 2, 150))).toBeGreaterThan(4.5)
    expect(mannWhitneyZ(latencies(200, 1, 150), latencies(200, 2))).toBeLessThan(-4.5)
  })

  it('finds no difference between groups drawn alike, spikes and all', () => {
    const groups = new Map([1, 2, 3, 4, 5].map((seed) => [`g${seed}`, latencies(200, seed)]))
    expect(compareWithBaseline(groups, 'g1').filter((c) => c.differs)).toEqual([])
  })

  it('flags a group shifted by more than the tolerance, and only that group', () => {
    const groups = new Map([
      ['none shared', latencies(200, 1)],
      ['some shared', latencies(200, 2, 40)],
      ['all shared', latencies(200, 3, 160)],
    ])
    const comparisons = compareWithBaseline(groups, 'none shared')
    // 40 µs is under the 100 µs of noise a loaded machine is allowed.
    expect(comparisons.find((c) => c.group === 'some shared')).toMatchObject({ differs: false })
    expect(comparisons.find((c) => c.group === 'all shared')).toMatchObject({ differs: true })
  })
})
