import { describe, expect, it } from 'vitest'
import { rateLimitHeaders, retryAfterSeconds } from '../../../gateway/src/rateLimit/rateLimitHeaders.ts'

const NOW = 1_795_598_100_250

type Window = { limit: number; remaining: number; resetMillis: number }

/** The headers at NOW for a key's minute and day windows in the given states. */
function headersFor(minute: Window, day: Window) {
  return rateLimitHeaders([{ name: 'minute', windowSeconds: 60, ...minute }, { name: 'day', windowSeconds: 86_400, ...day }], NOW)
}

describe('rate-limit headers', () => {
  it('describe the window nearest exhaustion in X-RateLimit-* and every window in the IETF fields', () => {
    const headers = headersFor({ limit: 60, remaining: 12, resetMillis: NOW + 30_100 }, { limit: 1_000, remaining: 3, resetMillis: NOW + 7_200_000 })
    expect(headers).toEqual({
      'x-ratelimit-limit': '1000',
      'x-ratelimit-remaining': '3',
      'x-ratelimit-reset': String(Math.ceil((NOW + 7_200_000) / 1_000)),
      'ratelimit-policy': '"minute";q=60;w=60, "day";q=1000;w=86400',
      ratelimit: '"minute";r=12;t=31, "day";r=3;t=7200',
    })
  })

  it('name the one of two equally tight windows that frees last, and never say less than zero left or a reset in the past', () => {
    const headers = headersFor({ limit: 60, remaining: -2, resetMillis: NOW - 1_500 }, { limit: 1_000, remaining: -2, resetMillis: NOW + 1_000 })
    expect(headers['x-ratelimit-limit']).toBe('1000')
    expect(headers['x-ratelimit-remaining']).toBe('0')
    expect(headers['x-ratelimit-reset']).toBe(String(Math.ceil((NOW + 1_000) / 1_000)))
    expect(headers.ratelimit).toBe('"minute";r=0;t=0, "day";r=0;t=1')
  })

  it('describe the day window when a request spends both windows at once', () => {
    const headers = headersFor({ limit: 5, remaining: 0, resetMillis: NOW + 10_000 }, { limit: 12, remaining: 0, resetMillis: NOW + 41_000 })
    expect(headers['x-ratelimit-limit']).toBe('12')
    expect(headers['x-ratelimit-reset']).toBe(String(Math.ceil((NOW + 41_000) / 1_000)))
  })

  // The day window resets at a fixed hour: a minute spent just before it frees after the day does.
  it('name the minute window when both are spent and the minute frees after the day', () => {
    const headers = headersFor({ limit: 5, remaining: 0, resetMillis: NOW + 50_000 }, { limit: 12, remaining: 0, resetMillis: NOW + 20_000 })
    expect(headers['x-ratelimit-limit']).toBe('5')
    expect(headers['x-ratelimit-reset']).toBe(String(Math.ceil((NOW + 50_000) / 1_000)))
  })

  it('round Retry-After up to whole seconds, at least 1', () => {
    expect([0, 1, 999, 1_000, 1_001].map(retryAfterSeconds)).toEqual(['1', '1', '1', '1', '2'])
  })
})
