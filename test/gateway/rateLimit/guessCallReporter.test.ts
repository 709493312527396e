import { Writable } from 'node:stream'
import { pino } from 'pino'
import { describe, expect, it } from 'vitest'
import { guessCallReporter } from '../../../gateway/src/rateLimit/limiter.ts'

describe('what the operator is told about the shared per-IP count of key guesses', () => {
  function reporter() {
    const lines: { level: number; msg: string }[] = []
    const logger = pino(new Writable({ write: (chunk: Buffer, _encoding, done) => (lines.push(JSON.parse(chunk.toString()) as (typeof lines)[number]), done()) }))
    const calls: string[] = []
    let now = 0
    const report = guessCallReporter('cluster', { call: (_store, _seconds, result) => calls.push(result) }, logger, () => now)
    return { report, lines, calls, at: (millis: number) => void (now = millis) }
  }

  it('one warning, then one error line for an outage where calls fail and succeed in turn (one Cluster master down), one recovery line after 10 s without failure', () => {
    const { report, lines, calls, at } = reporter()
    for (let i = 0; i < 60; i++) {
      at(i * 100)
      report(0.05, i % 2 === 0 ? 'timeout' : 'ok')
    }
    expect(lines.map((line) => [line.level, line.msg])).toEqual([
      [40, 'per-IP count of key guesses: a call to Redis failed; counted by this gateway alone meanwhile'],
      [50, 'per-IP count of key guesses failing in Redis: each gateway counts guesses alone until it recovers'],
    ])
    at(5_800 + 9_999) // the last failure was at 5.8 s
    report(0.001, 'ok')
    expect(lines).toHaveLength(2)
    at(5_800 + 10_000)
    report(0.001, 'ok')
    expect(lines.at(-1)).toMatchObject({ level: 30, msg: 'per-IP count of key guesses recovered: shared in Redis again' })
    // Every call is in the store's metrics, failed or not.
    expect(calls).toHaveLength(62)
    expect(calls.filter((result) => result === 'timeout')).toHaveLength(30)
  })

  it('a stall on a busy machine, which fails the calls it holds at once, is a warning and its recovery, not an error', () => {
    const { report, lines, at } = reporter()
    for (let i = 0; i < 20; i++) report(0.05, 'timeout')
    at(50)
    report(0.001, 'ok')
    at(10_000)
    report(0.001, 'ok')
    expect(lines.map((line) => [line.level, line.msg])).toEqual([
      [40, 'per-IP count of key guesses: a call to Redis failed; counted by this gateway alone meanwhile'],
      [30, 'per-IP count of key guesses recovered: shared in Redis again'],
    ])
  })

  it('a late reply long after the last one, with calls served in between, is a new warning, not the error of an outage', () => {
    const { report, lines, at } = reporter()
    report(0.05, 'timeout')
    at(50)
    report(0.001, 'ok')
    // Guesses are sparse: the next call comes a minute later, and is one more late reply.
    at(60_000)
    report(0.05, 'timeout')
    expect(lines.map((line) => [line.level, line.msg])).toEqual([
      [40, 'per-IP count of key guesses: a call to Redis failed; counted by this gateway alone meanwhile'],
      [30, 'per-IP count of key guesses recovered: shared in Redis again'],
      [40, 'per-IP count of key guesses: a call to Redis failed; counted by this gateway alone meanwhile'],
    ])
  })
})
