import { describe, expect, it } from 'vitest'
import { RedisBudgetExceededError, withinBudget, type WhenSent } from '../../../gateway/src/rateLimit/redisStore.ts'

const replyAfter = (millis: number) => new Promise<string>((resolve) => setTimeout(() => resolve('reply'), millis))
const sentAfter =
  (millis: number): WhenSent =>
  (callback) =>
    void setTimeout(callback, millis)

describe('the Redis time budget', () => {
  // Regression: the budget used to start when the command was queued. Writes are held until the
  // turn's check phase, so a turn kept busy for longer than the budget spent it before the
  // command had even left, and the request went to the per-process fallback (storeFaults'
  // "a busy gateway is not a slow Redis" failed that way on a loaded machine).
  it('starts when the command leaves the process, not while the turn that queued it is still busy', async () => {
    await expect(withinBudget(replyAfter(130), 50, sentAfter(100))).resolves.toBe('reply')
  })

  it('still refuses a reply that comes later than the budget after the command left', async () => {
    await expect(withinBudget(replyAfter(200), 50, sentAfter(10))).rejects.toBeInstanceOf(RedisBudgetExceededError)
  })
})
