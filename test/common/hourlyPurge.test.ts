import { Writable } from 'node:stream'
import { pino } from 'pino'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { purgeHourly } from '../../common/src/database/hourlyPurge.ts'

/** A logger whose lines the test reads. */
function recordingLogger() {
  const lines: { level: number; msg: string; purged?: number }[] = []
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(JSON.parse(chunk.toString()) as (typeof lines)[number])
      done()
    },
  })
  return { logger: pino(stream), lines }
}

describe('the hourly purge both services run', () => {
  afterEach(() => vi.useRealTimers())

  it('purges at start and then every hour, says what it removed, says when it failed, and stops when told', async () => {
    vi.useFakeTimers()
    const { logger, lines } = recordingLogger()
    const results: (() => Promise<number>)[] = [async () => 12, async () => 0, async () => Promise.reject(new Error('statement timeout'))]
    let runs = 0
    const stop = purgeHourly('old rows', () => results[runs++]!(), logger)
    await vi.advanceTimersByTimeAsync(0)
    expect(runs).toBe(1)
    await vi.advanceTimersByTimeAsync(3_600_000)
    await vi.advanceTimersByTimeAsync(3_600_000)
    expect(runs).toBe(3)
    expect(lines.map((line) => [line.level, line.msg, line.purged])).toEqual([
      [30, 'old rows purged', 12],
      [40, 'old rows: purge failed', undefined],
    ])
    stop()
    await vi.advanceTimersByTimeAsync(3 * 3_600_000)
    expect(runs).toBe(3)
  })
})
