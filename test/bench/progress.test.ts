import { describe, expect, it } from 'vitest'
import { createProgress, estimateRemaining, formatDuration, formatProgressLine } from '../../bench/lib/progress.ts'

const state = {
  phase: 'closed 100 conn',
  target: 'gateway-banned',
  round: 3,
  rounds: 5,
  elapsedSeconds: 151,
  etaSeconds: 492,
  fraction: 0.34,
}

function recorder(isTTY: boolean, columns = 120) {
  const chunks: string[] = []
  return { chunks, stream: { isTTY, columns, write: (text: string) => chunks.push(text) } }
}

describe('the bench progress line', () => {
  it('formats durations as m:ss, and h:mm:ss from an hour', () => {
    expect(formatDuration(0)).toBe('0:00')
    expect(formatDuration(59.6)).toBe('1:00')
    expect(formatDuration(492)).toBe('8:12')
    expect(formatDuration(3_725)).toBe('1:02:05')
    expect(formatDuration(-3)).toBe('0:00')
  })

  it('shows phase, target, round, elapsed, ETA, a bar and the percentage', () => {
    const line = formatProgressLine(state, 120)
    expect(line).toBe('[bench] closed 100 conn · gateway-banned · round 3/5 · 2:31 elapsed · ETA 8:12 [##########--------------------]  34 %')
  })

  it('leaves the round out during the warm-up and says ETA ? before anything is known', () => {
    const { etaSeconds: _unknown, ...rest } = state
    const line = formatProgressLine({ ...rest, phase: 'warm-up', round: 0, rounds: 0 }, 120)
    expect(line).not.toContain('round')
    expect(line).toContain('ETA ?')
  })

  it('fits a narrow terminal: the bar goes first, then the target is cut, never the ETA', () => {
    for (const width of [100, 80, 70, 60]) {
      const line = formatProgressLine({ ...state, target: 'peer: bearer map + @fastify/rate-limit (Redis) + http-proxy' }, width)
      expect(line.length).toBeLessThanOrEqual(width)
      if (width >= 80) expect(line).toContain('ETA 8:12')
    }
    expect(formatProgressLine(state, 75)).not.toContain('[#')
  })

  it('redraws one line on a terminal, with messages printed above it and the line cleared at the end', () => {
    const { chunks, stream } = recorder(true)
    const progress = createProgress(stream, () => 0)
    progress.update(state)
    progress.log('round done')
    progress.done()
    const clearLine = '\r\x1b[2K'
    expect(chunks[0]?.startsWith(`${clearLine}[bench] closed 100 conn · gateway-banned`)).toBe(true)
    expect(chunks.slice(1, 3)).toEqual([clearLine, '[bench] round done\n'])
    expect(chunks[3]?.startsWith(`${clearLine}[bench] closed 100 conn`)).toBe(true)
    expect(chunks.at(-1)).toBe('\r\x1b[2K')
  })

  it('writes only the plain lines when stderr is not a terminal (a pipe, a CI log)', () => {
    const { chunks, stream } = recorder(false)
    const progress = createProgress(stream, () => 0)
    progress.update(state)
    progress.log('round done')
    progress.done()
    expect(chunks).toEqual(['[bench] round done\n'])
  })

  it('estimates what is left from the plan, stretched by how much slower than planned the run has been', () => {
    expect(estimateRemaining(0, 600, 0)).toBe(600)
    expect(estimateRemaining(100, 500, 150)).toBe(750)
    expect(estimateRemaining(100, 500, 80)).toBe(500)
  })
})
