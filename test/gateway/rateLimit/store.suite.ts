import { randomBytes } from 'node:crypto'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { LimitRequest, LimitStore, WindowSpec } from '../../../gateway/src/rateLimit/limitStore.ts'
import { unbanAppliedKey } from '../../../gateway/src/rateLimit/limitStore.ts'

export interface StoreUnderTest {
  store: LimitStore
  /** Redis only: the TTL (ms) and MEMORY USAGE of a key's state. */
  inspect?: (keyId: string) => Promise<{ pttl: number; bytes: number }>
  /** Redis only: the TTL (ms) of a key, named without the key prefix. */
  pttl?: (key: string) => Promise<number>
  close(): Promise<void>
}

const T0 = 1_800_000_000_000
const noBans = { strikes: 1_000_000, ladderMillis: [60_000], memoryMillis: 86_400_000 }
const freePlan = {
  minute: { limit: 60, windowMillis: 60_000, bucketMillis: 5_000 },
  day: { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
}

function request(keyId: string, nowMillis: number, overrides: Partial<LimitRequest> = {}): LimitRequest {
  return { keyId, nowMillis, ...freePlan, bans: noBans, ...overrides }
}

const newKeyId = () => `key_${randomBytes(6).toString('hex')}`

/** An unban's entry in the key change log: each unban has its own. */
let changeIds = 0
const newChangeId = () => ++changeIds

/**
 * The reference model: the conservative bucketed window, written the obvious way over a list of
 * admission times. The stores must agree with it on every decision and every remaining count.
 */
function modelCount(admitted: number[], spec: WindowSpec, now: number): number {
  const buckets = Math.floor(spec.windowMillis / spec.bucketMillis)
  const current = Math.floor(now / spec.bucketMillis)
  return admitted.filter((time) => Math.floor(time / spec.bucketMillis) >= current - buckets).length
}

/** The semantics both stores promise, run against each of them. */
export function describeLimitStore(label: string, open: () => Promise<StoreUnderTest>) {
  describe(`rate-limit store conformance: ${label}`, () => {
    let subject: StoreUnderTest
    beforeAll(async () => {
      subject = await open()
    })
    afterAll(async () => {
      await subject?.close()
    })

    it('admits up to the minute limit, then limits with the time until a request would be admitted', async () => {
      const keyId = newKeyId()
      for (let i = 0; i < 60; i++) {
        const decision = await subject.store.consume(request(keyId, T0 + i * 100))
        expect(decision.outcome).toBe('admitted')
        expect(decision.minute.remaining).toBe(59 - i)
        expect(decision.day.remaining).toBe(999 - i)
      }
      const limited = await subject.store.consume(request(keyId, T0 + 6_000))
      expect(limited.outcome).toBe('limited')
      expect(limited.minute.remaining).toBe(0)
      // All 60 landed in the bucket starting at T0; they all leave it at T0 + 65 s.
      expect(limited.nowMillis + limited.retryAfterMillis).toBe(T0 + 65_000)
      expect((await subject.store.consume(request(keyId, T0 + 64_999))).outcome).toBe('limited')
      expect((await subject.store.consume(request(keyId, T0 + 65_000))).outcome).toBe('admitted')
    })

    it('after the limit is lowered below what the window holds, says the window resets when a request would be admitted again', async () => {
      const keyId = newKeyId()
      for (let i = 0; i < 3; i++) await subject.store.consume(request(keyId, T0))
      for (let i = 0; i < 2; i++) await subject.store.consume(request(keyId, T0 + 5_000))
      const lowered = { ...freePlan, minute: { ...freePlan.minute, limit: 2 } }
      const limited = await subject.store.consume(request(keyId, T0 + 10_000, lowered))
      expect(limited.outcome).toBe('limited')
      // Four of the five must leave before a request fits under 2: the bucket at T0 + 5 s is the last to go.
      expect(limited.nowMillis + limited.retryAfterMillis).toBe(T0 + 70_000)
      expect(limited.minute.resetMillis).toBe(T0 + 70_000)
      // The window holds five against a limit of two: nothing is left, not minus three.
      expect(limited.minute.remaining).toBe(0)
      expect((await subject.store.consume(request(keyId, T0 + 69_999, lowered))).outcome).toBe('limited')
      expect((await subject.store.consume(request(keyId, T0 + 70_000, lowered))).outcome).toBe('admitted')
    })

    it('says a window with room resets when its oldest counted request leaves it', async () => {
      const keyId = newKeyId()
      await subject.store.consume(request(keyId, T0 + 1_000))
      const second = await subject.store.consume(request(keyId, T0 + 7_000))
      // The request at T0 + 1 s is counted in the bucket [T0, T0 + 5 s): the minute lets it go at
      // T0 + 65 s, the day (hour buckets) at T0 + 25 h. X-RateLimit-Reset is this moment.
      expect(second.minute).toEqual({ limit: 60, remaining: 58, resetMillis: T0 + 65_000 })
      expect(second.day).toEqual({ limit: 1_000, remaining: 998, resetMillis: T0 + 86_400_000 + 3_600_000 })
    })

    it('charges nothing to either window for a rejected request', async () => {
      const keyId = newKeyId()
      const plan = { ...freePlan, minute: { ...freePlan.minute, limit: 2 } }
      await subject.store.consume(request(keyId, T0, plan))
      await subject.store.consume(request(keyId, T0, plan))
      for (let i = 0; i < 5; i++) {
        const limited = await subject.store.consume(request(keyId, T0 + 1, plan))
        expect(limited.outcome).toBe('limited')
        expect(limited.day.remaining).toBe(998)
      }
    })

    it('limits on the day window when the day is spent, whatever the minute says', async () => {
      const keyId = newKeyId()
      const plan = { ...freePlan, day: { limit: 3, windowMillis: 86_400_000, bucketMillis: 3_600_000 } }
      for (let i = 0; i < 3; i++) expect((await subject.store.consume(request(keyId, T0 + i * 61_000, plan))).outcome).toBe('admitted')
      const limited = await subject.store.consume(request(keyId, T0 + 10 * 61_000, plan))
      expect(limited).toMatchObject({ outcome: 'limited', day: { remaining: 0 } })
      expect(limited.minute.remaining).toBe(60)
      expect(limited.nowMillis + limited.retryAfterMillis).toBe(T0 + 86_400_000 + 3_600_000)
    })

    it('never lets a rolling window hold more than the limit, and agrees with the model on every decision', async () => {
      await fc.assert(
        fc.asyncProperty(
          fc.integer({ min: 1, max: 8 }),
          fc.integer({ min: 2, max: 10 }),
          fc.array(fc.integer({ min: 0, max: 700 }), { minLength: 1, maxLength: 80 }),
          async (limit, buckets, gaps) => {
            const keyId = newKeyId()
            const minute: WindowSpec = { limit, windowMillis: buckets * 100, bucketMillis: 100 }
            const day: WindowSpec = { limit: limit * 3, windowMillis: buckets * 500, bucketMillis: 500 }
            const admitted: number[] = []
            let now = T0
            for (const gap of gaps) {
              now += gap
              const expectedMinute = modelCount(admitted, minute, now)
              const expectedDay = modelCount(admitted, day, now)
              const shouldAdmit = expectedMinute < minute.limit && expectedDay < day.limit
              const decision = await subject.store.consume({ keyId, nowMillis: now, minute, day, bans: noBans })
              expect(decision.outcome).toBe(shouldAdmit ? 'admitted' : 'limited')
              if (decision.outcome === 'admitted') admitted.push(now)
              expect(decision.minute.remaining).toBe(Math.max(minute.limit - modelCount(admitted, minute, now), 0))
              expect(decision.day.remaining).toBe(Math.max(day.limit - modelCount(admitted, day, now), 0))
              if (decision.outcome === 'limited') {
                // Retry-After is never early: just before it, the model still refuses.
                const at = now + decision.retryAfterMillis
                expect(decision.retryAfterMillis).toBeGreaterThan(0)
                const before = at - 1
                expect(modelCount(admitted, minute, before) >= minute.limit || modelCount(admitted, day, before) >= day.limit).toBe(true)
                expect(modelCount(admitted, minute, at) < minute.limit && modelCount(admitted, day, at) < day.limit).toBe(true)
              }
            }
            for (const spec of [minute, day]) {
              for (const end of admitted) {
                const inSpan = admitted.filter((time) => time > end - spec.windowMillis && time <= end).length
                expect(inSpan).toBeLessThanOrEqual(spec.limit)
              }
            }
          },
        ),
        { numRuns: 60 },
      )
    })

    it('bans after the strike threshold, climbing the ladder with each new ban within the memory', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 3, ladderMillis: [10_000, 50_000, 90_000], memoryMillis: 86_400_000 }
      const plan = { ...freePlan, minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, bans }
      expect((await subject.store.consume(request(keyId, T0, plan))).outcome).toBe('admitted')
      expect((await subject.store.consume(request(keyId, T0 + 1, plan))).outcome).toBe('limited')
      expect((await subject.store.consume(request(keyId, T0 + 2, plan))).outcome).toBe('limited')
      // The ban is 10 s, but the minute window (the request at T0) lets a request in only at T0 + 65 s.
      const banned = await subject.store.consume(request(keyId, T0 + 3, plan))
      expect(banned).toMatchObject({ outcome: 'banned', banMillisLeft: 10_000, retryAfterMillis: 64_997, banStep: 0, newBan: true })
      const during = await subject.store.consume(request(keyId, T0 + 5_000, plan))
      expect(during).toMatchObject({ outcome: 'banned', banMillisLeft: 5_003, retryAfterMillis: 60_000, banStep: 0, newBan: false })

      // After the first ban ends the window is still full: three more strikes, the second step.
      let now = T0 + 10_003
      for (let i = 0; i < 2; i++) expect((await subject.store.consume(request(keyId, now++, plan))).outcome).toBe('limited')
      expect(await subject.store.consume(request(keyId, now, plan))).toMatchObject({ outcome: 'banned', banMillisLeft: 50_000, banStep: 1 })
    })

    it("gives a ban a Retry-After that is never earlier than the moment a request is admitted", async () => {
      const keyId = newKeyId()
      const bans = { strikes: 1, ladderMillis: [5_000], memoryMillis: 86_400_000 }
      const plan = { ...freePlan, minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, bans }
      await subject.store.consume(request(keyId, T0, plan))
      const banned = await subject.store.consume(request(keyId, T0 + 1_000, plan))
      expect(banned).toMatchObject({ outcome: 'banned', banMillisLeft: 5_000 })
      const retryAt = banned.nowMillis + banned.retryAfterMillis
      expect(retryAt).toBe(T0 + 65_000)
      // Between the ban's end and Retry-After the window is still full...
      expect((await subject.store.consume(request(keyId, T0 + 6_001, { ...plan, bans: noBans }))).outcome).toBe('limited')
      // ...and at Retry-After the request is admitted.
      expect((await subject.store.consume(request(keyId, retryAt, plan))).outcome).toBe('admitted')
    })

    it('bans on the strikes within any rolling minute, wherever the minute boundaries fall', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 10, ladderMillis: [60_000], memoryMillis: 86_400_000 }
      const full = { minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, day: { limit: 1, windowMillis: 86_400_000, bucketMillis: 3_600_000 }, bans }
      await subject.store.consume(request(keyId, T0, full))
      expect((await subject.store.consume(request(keyId, T0 + 1, full))).outcome).toBe('limited')
      for (let i = 0; i < 8; i++) expect((await subject.store.consume(request(keyId, T0 + 59_000 + i, full))).outcome).toBe('limited')
      // The tenth strike within the rolling minute (T0 + 0.5 s … T0 + 60.5 s) bans.
      expect(await subject.store.consume(request(keyId, T0 + 60_500, full))).toMatchObject({ outcome: 'banned', newBan: true })
    })

    it('does not ban for strikes spread wider than the minute and its bucket', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 10, ladderMillis: [60_000], memoryMillis: 86_400_000 }
      const full = { minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, day: { limit: 1, windowMillis: 86_400_000, bucketMillis: 3_600_000 }, bans }
      await subject.store.consume(request(keyId, T0, full))
      for (let i = 1; i <= 9; i++) expect((await subject.store.consume(request(keyId, T0 + i, full))).outcome).toBe('limited')
      expect((await subject.store.consume(request(keyId, T0 + 70_000, full))).outcome).toBe('limited')
    })

    it('forgets the ladder step once the ban memory has passed', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 1, ladderMillis: [1_000, 5_000], memoryMillis: 10_000 }
      const plan = { ...freePlan, minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, day: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, bans }
      await subject.store.consume(request(keyId, T0, plan))
      expect(await subject.store.consume(request(keyId, T0 + 1, plan))).toMatchObject({ outcome: 'banned', banStep: 0 })
      expect(await subject.store.consume(request(keyId, T0 + 2_000, plan))).toMatchObject({ outcome: 'banned', banStep: 1 })
      expect(await subject.store.consume(request(keyId, T0 + 30_000, plan))).toMatchObject({ outcome: 'banned', banStep: 0 })
    })

    it('lifts a ban on unban, clears the strikes and keeps the ladder step', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 2, ladderMillis: [10_000, 50_000], memoryMillis: 86_400_000 }
      const plan = { ...freePlan, minute: { limit: 1, windowMillis: 1_000, bucketMillis: 100 }, bans }
      await subject.store.consume(request(keyId, T0, plan))
      await subject.store.consume(request(keyId, T0 + 1, plan))
      expect((await subject.store.consume(request(keyId, T0 + 2, plan))).outcome).toBe('banned')
      await subject.store.unban(keyId, newChangeId(), { nowMillis: T0 + 1_000 })
      expect((await subject.store.consume(request(keyId, T0 + 3_000, plan))).outcome).toBe('admitted')
      // One strike after the unban is not enough to ban again (strikes were cleared)...
      expect((await subject.store.consume(request(keyId, T0 + 3_001, plan))).outcome).toBe('limited')
      // ...the second is, and the ban is the ladder's second step.
      expect(await subject.store.consume(request(keyId, T0 + 3_002, plan))).toMatchObject({ outcome: 'banned', banStep: 1 })
    })

    // The lifted ban ended at the unban: the ladder remembers it for the memory from then, as it
    // would a ban that ended on its own, not from the end the lifted ban would have had.
    it('keeps the ladder step for the ban memory from the unban, not from the end the lifted ban was due', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 1, ladderMillis: [1_000, 50_000], memoryMillis: 10_000 }
      const plan = { minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, bans }
      await subject.store.consume(request(keyId, T0, plan))
      expect(await subject.store.consume(request(keyId, T0 + 1, plan))).toMatchObject({ outcome: 'banned', banStep: 0 })
      // The second ban, 50 s, would end at T0 + 52 s; it is lifted at T0 + 3 s.
      expect(await subject.store.consume(request(keyId, T0 + 2_000, plan))).toMatchObject({ outcome: 'banned', banStep: 1 })
      await subject.store.unban(keyId, newChangeId(), { nowMillis: T0 + 3_000, memoryMillis: bans.memoryMillis })
      // 17 s after the unban, past the 10 s memory: the next ban starts again from the first step.
      expect(await subject.store.consume(request(keyId, T0 + 20_000, plan))).toMatchObject({ outcome: 'banned', newBan: true, banStep: 0, banMillisLeft: 1_000 })
    })

    it('applies each unban once: a repeat of it leaves a ban the key earned since, another unban lifts it', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 1, ladderMillis: [10_000, 50_000], memoryMillis: 86_400_000 }
      const plan = { ...freePlan, minute: { limit: 1, windowMillis: 1_000, bucketMillis: 100 }, bans }
      await subject.store.consume(request(keyId, T0, plan))
      expect((await subject.store.consume(request(keyId, T0 + 1, plan))).outcome).toBe('banned')
      const unban = newChangeId()
      expect(await subject.store.unban(keyId, unban, { nowMillis: T0 + 1_000 })).toBe(true)
      expect((await subject.store.consume(request(keyId, T0 + 2_000, plan))).outcome).toBe('admitted')
      // The key earns its next ban after the unban was applied...
      expect(await subject.store.consume(request(keyId, T0 + 2_001, plan))).toMatchObject({ outcome: 'banned', newBan: true, banStep: 1 })
      // ...and the same unban applied again (by a gateway further from the store) leaves it.
      expect(await subject.store.unban(keyId, unban, { nowMillis: T0 + 2_001 })).toBe(false)
      expect(await subject.store.consume(request(keyId, T0 + 2_002, plan))).toMatchObject({ outcome: 'banned', banStep: 1 })
      expect(await subject.store.unban(keyId, newChangeId(), { nowMillis: T0 + 3_000 })).toBe(true)
      expect((await subject.store.consume(request(keyId, T0 + 4_000, plan))).outcome).toBe('admitted')
    })

    it('applies an unban of a key with no state once: a repeat after the key was banned leaves the ban', async () => {
      const keyId = newKeyId()
      const plan = { ...freePlan, minute: { limit: 1, windowMillis: 1_000, bucketMillis: 100 }, bans: { strikes: 1, ladderMillis: [10_000], memoryMillis: 86_400_000 } }
      const unban = newChangeId()
      expect(await subject.store.unban(keyId, unban)).toBe(true)
      await subject.store.consume(request(keyId, T0, plan))
      expect((await subject.store.consume(request(keyId, T0 + 1, plan))).outcome).toBe('banned')
      expect(await subject.store.unban(keyId, unban)).toBe(false)
      expect((await subject.store.consume(request(keyId, T0 + 2, plan))).outcome).toBe('banned')
    })

    it('clears on unban the strikes a key gathered short of a ban', async () => {
      const keyId = newKeyId()
      const plan = { minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, bans: { strikes: 3, ladderMillis: [60_000], memoryMillis: 86_400_000 } }
      expect((await subject.store.consume(request(keyId, T0, plan))).outcome).toBe('admitted')
      // Two strikes of the three that ban.
      expect((await subject.store.consume(request(keyId, T0 + 1, plan))).outcome).toBe('limited')
      expect((await subject.store.consume(request(keyId, T0 + 2, plan))).outcome).toBe('limited')
      await subject.store.unban(keyId, newChangeId())
      // One more request while limited is the first strike since, not the third.
      expect((await subject.store.consume(request(keyId, T0 + 3, plan))).outcome).toBe('limited')
    })

    it('climbs the ladder for a ban that comes within the memory of the previous ban’s end', async () => {
      const keyId = newKeyId()
      const bans = { strikes: 1, ladderMillis: [1_000, 100_000], memoryMillis: 10_000 }
      const plan = { minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, day: { limit: 1, windowMillis: 86_400_000, bucketMillis: 3_600_000 }, bans }
      await subject.store.consume(request(keyId, T0, plan))
      expect(await subject.store.consume(request(keyId, T0 + 1, plan))).toMatchObject({ outcome: 'banned', banStep: 0 })
      expect(await subject.store.consume(request(keyId, T0 + 2_000, plan))).toMatchObject({ outcome: 'banned', banStep: 1 })
      // That ban ends at T0 + 102 s; 3 s later is well within 10 s of its end, though 103 s after it began.
      expect(await subject.store.consume(request(keyId, T0 + 105_000, plan))).toMatchObject({ outcome: 'banned', banStep: 1 })
    })

    describe('when a reload changes the window settings', () => {
      const tenSeconds = { limit: 5, windowMillis: 10_000, bucketMillis: 1_000 }

      it('keeps counting the requests already admitted when the bucket length changes, without locking the key out', async () => {
        const keyId = newKeyId()
        for (let i = 0; i < 5; i++) expect((await subject.store.consume(request(keyId, T0 + i, { minute: tenSeconds }))).outcome).toBe('admitted')
        // Same number of buckets, twice as long: the five requests of bucket [T0, T0 + 1 s) now sit in [T0, T0 + 2 s).
        const twenty = { minute: { limit: 5, windowMillis: 20_000, bucketMillis: 2_000 } }
        const limited = await subject.store.consume(request(keyId, T0 + 5_000, twenty))
        expect(limited).toMatchObject({ outcome: 'limited' })
        expect(limited.nowMillis + limited.retryAfterMillis).toBe(T0 + 22_000)
        expect((await subject.store.consume(request(keyId, T0 + 22_000, twenty))).outcome).toBe('admitted')
      })

      it('admits no more than the limit while gateways with the old and the new settings alternate', async () => {
        const keyId = newKeyId()
        const coarse = { minute: { limit: 5, windowMillis: 10_000, bucketMillis: 2_000 } }
        let admitted = 0
        for (let i = 0; i < 30; i++) {
          const decision = await subject.store.consume(request(keyId, T0 + i * 100, i % 2 === 0 ? { minute: tenSeconds } : coarse))
          if (decision.outcome === 'admitted') admitted++
        }
        expect(admitted).toBe(5)
      })

      // Converting to the shorter ring drops what only the longer window still counted, so while
      // both lengths are in use the key is held to its limit over the shorter window (README).
      it('holds the key to the limit over the shorter window while gateways with the old and the new window length alternate', async () => {
        const keyId = newKeyId()
        const short = { minute: { limit: 10, windowMillis: 20_000, bucketMillis: 5_000 } }
        const long = { minute: { limit: 10, windowMillis: 60_000, bucketMillis: 5_000 } }
        const admittedAt: number[] = []
        for (let t = 0; t < 180_000; t += 250) {
          const decision = await subject.store.consume(request(keyId, T0 + t, Math.floor(t / 1_000) % 2 === 0 ? long : short))
          if (decision.outcome === 'admitted') admittedAt.push(t)
        }
        const mostInAnySpan = Math.max(...admittedAt.map((end) => admittedAt.filter((t) => t > end - 20_000 && t <= end).length))
        expect(mostInAnySpan).toBe(10)
        expect(admittedAt.length).toBeGreaterThanOrEqual(50)
      })

      it('keeps a ban in force', async () => {
        const keyId = newKeyId()
        const bans = { strikes: 1, ladderMillis: [20_000], memoryMillis: 86_400_000 }
        await subject.store.consume(request(keyId, T0, { minute: { ...tenSeconds, limit: 1 }, bans }))
        expect((await subject.store.consume(request(keyId, T0 + 1, { minute: { ...tenSeconds, limit: 1 }, bans }))).outcome).toBe('banned')
        const reshaped = { day: { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 7_200_000 }, bans }
        expect(await subject.store.consume(request(keyId, T0 + 2, reshaped))).toMatchObject({ outcome: 'banned', banMillisLeft: 19_999 })
      })
    })

    it('keeps a key limited, not locked out, when the store clock goes back by more than a window', async () => {
      const keyId = newKeyId()
      const plan = { minute: { limit: 2, windowMillis: 60_000, bucketMillis: 5_000 } }
      for (let i = 0; i < 2; i++) await subject.store.consume(request(keyId, T0 + 600_000, plan))
      const limited = await subject.store.consume(request(keyId, T0, plan))
      expect(limited.outcome).toBe('limited')
      expect(limited.retryAfterMillis).toBeLessThanOrEqual(65_000)
      expect((await subject.store.consume(request(keyId, T0 + 65_000, plan))).outcome).toBe('admitted')
    })

    if (label !== 'in-process memory') {
      it('keeps one key under 400 bytes with both windows and strikes, with a TTL that outlasts its day window by at most a bucket', async () => {
        const keyId = `key_${randomBytes(9).toString('base64url')}`
        const business = {
          minute: { limit: 1_000, windowMillis: 60_000, bucketMillis: 5_000 },
          day: { limit: 100_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 },
          bans: { strikes: 10, ladderMillis: [60_000, 300_000, 900_000, 3_600_000, 86_400_000], memoryMillis: 86_400_000 },
        }
        for (let i = 0; i < 30; i++) await subject.store.consume({ keyId, ...business })
        const { pttl, bytes } = await subject.inspect!(keyId)
        // Shorter, and the day's admissions would be forgotten while the day window still counts them.
        expect(pttl).toBeGreaterThanOrEqual(86_400_000)
        expect(pttl).toBeLessThanOrEqual(86_400_000 + 3_600_000)
        expect(bytes).toBeLessThanOrEqual(400)
      })

      it('keeps a TTL on a key whose ban was lifted', async () => {
        const keyId = newKeyId()
        const banOnFirstStrike = { ...freePlan, minute: { limit: 1, windowMillis: 60_000, bucketMillis: 5_000 }, bans: { strikes: 1, ladderMillis: [60_000], memoryMillis: 86_400_000 } }
        await subject.store.consume({ keyId, ...banOnFirstStrike })
        expect((await subject.store.consume({ keyId, ...banOnFirstStrike })).outcome).toBe('banned')
        const unban = newChangeId()
        await subject.store.unban(keyId, unban)
        // The unban rewrites the state; without its TTL a key never used again would stay forever.
        const { pttl } = await subject.inspect!(keyId)
        expect(pttl).toBeGreaterThan(86_400_000)
        expect(pttl).toBeLessThanOrEqual(86_400_000 + 3_600_000)
        // Nor does the mark that the unban was applied stay: a day, as long as unbans are retried.
        const marked = await subject.pttl!(unbanAppliedKey(keyId, unban))
        expect(marked).toBeGreaterThan(86_400_000 - 60_000)
        expect(marked).toBeLessThanOrEqual(86_400_000)
      })

      // On the store clock: the state must outlive its windows and its ban for as long as the
      // ladder remembers the ban, or an idle key's next ban starts again from the first step.
      it('remembers the ban ladder of a key idle past its ban and windows, so its next ban climbs a step', async () => {
        const idle = {
          keyId: newKeyId(),
          minute: { limit: 1, windowMillis: 200, bucketMillis: 100 },
          day: { limit: 1_000, windowMillis: 200, bucketMillis: 100 },
          bans: { strikes: 1, ladderMillis: [300, 5_000], memoryMillis: 10_000 },
        }
        expect((await subject.store.consume(idle)).outcome).toBe('admitted')
        const first = await subject.store.consume(idle)
        expect(first).toMatchObject({ outcome: 'banned', newBan: true, banStep: 0 })
        await new Promise((resolve) => setTimeout(resolve, first.banMillisLeft + 2 * 300))
        expect((await subject.store.consume(idle)).outcome).toBe('admitted')
        expect(await subject.store.consume(idle)).toMatchObject({ outcome: 'banned', newBan: true, banStep: 1 })
      })

      it('uses the store clock (Redis TIME) when no time is given', async () => {
        const decision = await subject.store.consume({ keyId: newKeyId(), ...freePlan, bans: noBans })
        expect(Math.abs(decision.nowMillis - Date.now())).toBeLessThan(5_000)
      })
    }
  })
}
