import { describe, expect, it } from 'vitest'
import { loadBenchConfig } from '../../bench/lib/config.ts'
import { planSteps, planSweep, plannedSeconds, STEP_OVERHEAD_SECONDS } from '../../bench/lib/sweep.ts'

describe('the bench sweep plan', () => {
  it('by default measures 1, 10 and 100 connections, reads the targets at 100, and offers 25, 50 and 75 % open loop', () => {
    const config = loadBenchConfig({})
    expect(config.connectionLevels).toEqual([1, 10, 100])
    expect(config.connections).toBe(100)
    expect(config.openLoopLoads).toEqual([0.25, 0.5, 0.75])
    expect(planSweep(config)).toEqual([
      { connections: 1, rounds: 3, durationSeconds: 2, goal: false },
      { connections: 10, rounds: 3, durationSeconds: 2, goal: false },
      { connections: 100, rounds: 5, durationSeconds: 5, goal: true },
    ])
  })

  it('keeps the load of a default full run of the default suite (12 rows, 4 open-loop) to about 11 minutes, leaving room for start-up and the scale phase in 15', () => {
    const config = loadBenchConfig({})
    const seconds = plannedSeconds(planSteps(config, 12, 4))
    expect(seconds).toBeGreaterThan(10 * 60)
    expect(seconds).toBeLessThanOrEqual(12 * 60)
  })

  it('accepts one level (the old BENCH_CONNECTIONS=50) and a list in any order, and refuses a goal level it does not sweep', () => {
    const single = loadBenchConfig({ BENCH_CONNECTIONS: '50' })
    expect(planSweep(single)).toEqual([{ connections: 50, rounds: 5, durationSeconds: 5, goal: true }])
    const listed = loadBenchConfig({ BENCH_CONNECTIONS: '64, 8,8', BENCH_ROUNDS: '4', BENCH_SWEEP_ROUNDS: '2', BENCH_SWEEP_DURATION_SECONDS: '1' })
    expect(listed.connectionLevels).toEqual([8, 64])
    expect(listed.connections).toBe(64)
    expect(planSweep(listed).map((point) => [point.connections, point.rounds, point.durationSeconds])).toEqual([
      [8, 2, 1],
      [64, 4, 5],
    ])
    expect(loadBenchConfig({ BENCH_CONNECTIONS: '1,10,100', BENCH_GOAL_CONNECTIONS: '10' }).connections).toBe(10)
    expect(() => loadBenchConfig({ BENCH_GOAL_CONNECTIONS: '50' })).toThrow(/BENCH_GOAL_CONNECTIONS/)
    expect(() => loadBenchConfig({ BENCH_CONNECTIONS: '1,ten' })).toThrow(/BENCH_CONNECTIONS/)
  })

  it('gives a quick run (BENCH_ROUNDS=2, 2 s) no longer sweep rounds than the goal level', () => {
    const quick = loadBenchConfig({ BENCH_ROUNDS: '2', BENCH_DURATION_SECONDS: '2' })
    expect(planSweep(quick).map((point) => [point.rounds, point.durationSeconds])).toEqual([
      [2, 2],
      [2, 2],
      [2, 2],
    ])
  })

  it('orders the steps warm-up, each level with its rounds interleaved across targets, then each open-loop load', () => {
    const config = loadBenchConfig({
      BENCH_CONNECTIONS: '1,10',
      BENCH_ROUNDS: '2',
      BENCH_SWEEP_ROUNDS: '1',
      BENCH_DURATION_SECONDS: '4',
      BENCH_SWEEP_DURATION_SECONDS: '2',
      BENCH_WARMUP_SECONDS: '3',
      BENCH_OPEN_LOOP_LOADS: '0.5',
      BENCH_OPEN_LOOP_ROUNDS: '1',
    })
    const steps = planSteps(config, 2, 1)
    expect(steps.map((step) => `${step.phase}:${step.connections}:${step.round}:${step.target}:${step.seconds}`)).toEqual([
      'warm-up:10:0:0:3',
      'warm-up:10:0:1:3',
      'closed:1:1:0:2',
      'closed:1:1:1:2',
      'closed:10:1:0:4',
      'closed:10:1:1:4',
      'closed:10:2:0:4',
      'closed:10:2:1:4',
      'open:10:1:0:4',
    ])
    expect(steps.at(-1)?.load).toBe(0.5)
    expect(plannedSeconds(steps)).toBeCloseTo(6 + 4 + 16 + 4 + steps.length * STEP_OVERHEAD_SECONDS)
  })

  it('plans no open-loop steps when no target runs open loop or the phase is off', () => {
    expect(planSteps(loadBenchConfig({}), 3, 0).some((step) => step.phase === 'open')).toBe(false)
    expect(planSteps(loadBenchConfig({ BENCH_OPEN_LOOP_LOADS: 'none' }), 3, 3).some((step) => step.phase === 'open')).toBe(false)
    expect(planSteps(loadBenchConfig({ BENCH_WARMUP_SECONDS: '0' }), 3, 0).some((step) => step.phase === 'warm-up')).toBe(false)
  })
})
