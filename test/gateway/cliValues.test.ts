import { describe, expect, it } from 'vitest'
import { parseExpires } from '../../gateway/src/cli/values.ts'

const now = new Date('2026-11-25T12:00:00Z')

describe('keys --expires', () => {
  it.each([
    ['45s', '2026-11-25T12:00:45.000Z'],
    ['1m', '2026-11-25T12:01:00.000Z'],
    ['90m', '2026-11-25T13:30:00.000Z'],
    ['12h', '2026-11-26T00:00:00.000Z'],
    ['30d', '2026-12-25T12:00:00.000Z'],
    ['2w', '2026-12-09T12:00:00.000Z'],
    ['2026-12-31', '2026-12-31T00:00:00.000Z'],
    ['2026-12-31T18:00:00Z', '2026-12-31T18:00:00.000Z'],
  ])('takes %s, the same units as the config file and weeks, or an ISO date', (raw, expected) => {
    expect(parseExpires(raw, now).toISOString()).toBe(expected)
  })

  it.each(['1y', '1.5h', 'soon', '2026-02-30'])('refuses %s, naming the forms it takes', (raw) => {
    expect(() => parseExpires(raw, now)).toThrow(`--expires must be a duration (90s, 30m, 12h, 30d, 8w) or an ISO date (2026-12-31, 2026-12-31T18:00:00Z), got "${raw}"`)
  })

  it('refuses a moment that is not in the future', () => {
    expect(() => parseExpires('0m', now)).toThrow('--expires 0m is not in the future')
    expect(() => parseExpires('2026-11-24', now)).toThrow('--expires 2026-11-24 is not in the future')
  })
})
