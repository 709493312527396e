import type { WindowState } from './limitStore.ts'

export interface NamedWindow extends WindowState {
  /** "minute", "day" or "anonymous": the policy name in the IETF fields. */
  name: string
  windowSeconds: number
}

/**
 * The spec's X-RateLimit-* headers for the window nearest exhaustion, and the IETF draft's
 * RateLimit-Policy / RateLimit fields (draft-ietf-httpapi-ratelimit-headers) for every window.
 */
export function rateLimitHeaders(windows: NamedWindow[], nowMillis: number): Record<string, string> {
  const tightest = windows.reduce((best, window) => (window.remaining < best.remaining ? window : best))
  const secondsUntil = (millis: number) => Math.max(Math.ceil((millis - nowMillis) / 1_000), 0)
  return {
    'x-ratelimit-limit': String(tightest.limit),
    'x-ratelimit-remaining': String(Math.max(tightest.remaining, 0)),
    'x-ratelimit-reset': String(Math.ceil(Math.max(tightest.resetMillis, nowMillis) / 1_000)),
    'ratelimit-policy': windows.map((w) => `"${w.name}";q=${w.limit};w=${w.windowSeconds}`).join(', '),
    ratelimit: windows.map((w) => `"${w.name}";r=${Math.max(w.remaining, 0)};t=${secondsUntil(w.resetMillis)}`).join(', '),
  }
}

/** Retry-After in whole seconds, at least 1, rounded up so it is never early. */
export function retryAfterSeconds(millis: number): string {
  return String(Math.max(Math.ceil(millis / 1_000), 1))
}
