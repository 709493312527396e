import { loadBenchConfig } from '../../bench/lib/config.ts'
import type { RoundMeasurement } from '../../bench/lib/load.ts'
import type { BenchReport, OpenLoopReport, TargetReport } from '../../bench/lib/report.ts'
import { summarize } from '../../bench/lib/stats.ts'

/** A measured round with the given req/s and latencies (everything else plausible). */
export function round(requestsPerSecond: number, latency: Partial<Pick<RoundMeasurement, 'latencyP50' | 'latencyP90' | 'latencyP99' | 'latencyP999'>> = {}): RoundMeasurement {
  return {
    round: 1,
    requestsPerSecond,
    latencyP50: latency.latencyP50 ?? 1,
    latencyP99: latency.latencyP99 ?? 5,
    ...(latency.latencyP90 === undefined ? {} : { latencyP90: latency.latencyP90 }),
    ...(latency.latencyP999 === undefined ? {} : { latencyP999: latency.latencyP999 }),
    latencyAverage: 1,
    latencyMax: 10,
    requests: requestsPerSecond * 5,
    non2xx: 0,
    unexpected: 0,
    errors: 0,
    timeouts: 0,
    statusCodes: { '200': requestsPerSecond * 5 },
    durationSeconds: 5,
    serverCpuMicrosPerRequest: 200,
    clientCpuPercent: 30,
  }
}

/** A row measured at 1, 10 and 100 connections with these req/s per round. */
export function measuredRow(id: string, label: string, byLevel: Record<number, number[]>): TargetReport {
  const sweep = Object.entries(byLevel).map(([connections, rates]) => {
    const rounds = rates.map((rate) => round(rate))
    return { connections: Number(connections), durationSeconds: 5, rounds, summary: summarize(rounds) }
  })
  const goal = sweep.find((level) => level.connections === 100) ?? (sweep.at(-1) as (typeof sweep)[number])
  return { id, label, request: 'GET /v1/pets?limit=20', description: `${label} row`, rounds: goal.rounds, summary: goal.summary, sweep }
}

export function skippedRow(id: string, label: string, reason: string): TargetReport {
  return { id, label, request: 'GET /v1/pets?limit=20', description: label, skipped: reason, rounds: [], summary: summarize([]), sweep: [] }
}

export function openLoopPhase(load: number, offeredRate: number, rows: Array<{ id: string; label: string; p50: number; p90: number; p99: number; p999: number }>): OpenLoopReport {
  return {
    load,
    baseline: 'http-proxy',
    saturationRate: offeredRate / load,
    offeredRate,
    tool: 'paced',
    targets: rows.map((row) => {
      const rounds = [round(offeredRate, { latencyP50: row.p50, latencyP90: row.p90, latencyP99: row.p99, latencyP999: row.p999 })]
      return { id: row.id, label: row.label, rounds, summary: summarize(rounds) }
    }),
  }
}

export function benchReport(targets: TargetReport[], openLoop: OpenLoopReport[] = []): BenchReport {
  return {
    startedAt: '2026-11-22T05:00:00.000Z',
    finishedAt: '2026-11-22T05:14:00.000Z',
    command: 'npm run bench',
    environment: {
      node: 'v20.20.2',
      platform: 'linux x64',
      cpuModel: 'Test CPU',
      cores: 2,
      memoryGiB: 8,
      autocannon: '8.0.0',
      gitCommit: 'abc1234',
      loadAverageAtStart: 0.5,
    },
    config: loadBenchConfig({}),
    database: { source: 'local', version: '15', name: 'aas_bench_test', pets: 1000 },
    targets,
    openLoop,
    goals: [],
    problems: [],
  }
}
