import { describe, expect, it } from 'vitest'
import { createAnonymousLimiter, type LookUpTurn } from '../../../gateway/src/rateLimit/anonymousLimiter.ts'

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

describe('the per-address count in this process', () => {
  it('counts refused requests not at all: a limit raised on reload gives the room it leaves at once', () => {
    const before = createAnonymousLimiter({ perMinute: 6, windowSeconds: 60 })
    const admitted = Array.from({ length: 9 }, () => before.consumeHere('192.0.2.77').admitted)
    expect(admitted).toEqual([true, true, true, true, true, true, false, false, false])
    const raised = createAnonymousLimiter({ perMinute: 9, windowSeconds: 60, replacing: before.counts })
    const after = Array.from({ length: 4 }, () => raised.consumeHere('192.0.2.77'))
    expect(after.map(({ admitted, remaining }) => [admitted, remaining])).toEqual([[true, 2], [true, 1], [true, 0], [false, 0]])
  })

  it("starts the window at the address's first request charged to it, not at an earlier lookup of a valid key", async () => {
    const limiter = createAnonymousLimiter({ perMinute: 6, windowSeconds: 1 })
    const lookUp = limiter.beginLookUp('192.0.2.78')
    if (lookUp.kind !== 'go') throw new Error(`a first lookup is a go, not ${lookUp.kind}`)
    lookUp.settled(true)
    await sleep(400)
    const first = limiter.consumeHere('192.0.2.78')
    expect([first.admitted, first.remaining]).toEqual([true, 5])
    expect(first.resetInMillis).toBeGreaterThan(900)
  })
})

describe('key lookups for one address while Postgres is slow', () => {
  // The window's limit of 3, then 3 overdue: past them the key cannot be checked now.
  it('keeps at most twice its limit under way, also across the reset of its window', async () => {
    const limiter = createAnonymousLimiter({ perMinute: 3, windowSeconds: 1 })
    const turns: LookUpTurn[] = Array.from({ length: 8 }, () => limiter.beginLookUp('192.0.2.7', true))
    expect(turns.map((turn) => turn.kind)).toEqual(['go', 'go', 'go', 'go', 'go', 'go', 'busy', 'busy'])
    await sleep(1_100)
    // The six are still under way in the new window: before, it counted none of them.
    expect(Array.from({ length: 8 }, () => limiter.beginLookUp('192.0.2.7', true).kind)).toEqual(Array.from({ length: 8 }, () => 'busy'))
    for (const turn of turns) if (turn.kind === 'go') turn.settled(false)
    expect(limiter.beginLookUp('192.0.2.7', true).kind).toBe('go')
  })
})
