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
  // Plain loops: this runs on every /v1 answer, and under tsx every closure created per call is
  // also renamed per call (esbuild's keepNames), which showed in profiles of the refusal paths.
  let tightest = windows[0] as NamedWindow
  let policy = ''
  let current = ''
  for (const window of windows) {
    // On a tie the window that frees last: that is when the client is really held back until.
    if (window.remaining < tightest.remaining || (window.remaining === tightest.remaining && window.resetMillis > tightest.resetMillis)) {
      tightest = window
    }
    const separator = policy === '' ? '' : ', '
    policy += `${separator}"${window.name}";q=${window.limit};w=${window.windowSeconds}`
    current += `${separator}"${window.name}";r=${Math.max(window.remaining, 0)};t=${secondsUntil(window.resetMillis, nowMillis)}`
  }
  return {
    'x-ratelimit-limit': String(tightest.limit),
    'x-ratelimit-remaining': String(Math.max(tightest.remaining, 0)),
    'x-ratelimit-reset': String(Math.ceil(Math.max(tightest.resetMillis, nowMillis) / 1_000)),
    'ratelimit-policy': policy,
    ratelimit: current,
  }
}

function secondsUntil(millis: number, nowMillis: number): number {
  return Math.max(Math.ceil((millis - nowMillis) / 1_000), 0)
}

/** Retry-After in whole seconds, at least 1, rounded up so it is never early. */
export function retryAfterSeconds(millis: number): string {
  return String(Math.max(Math.ceil(millis / 1_000), 1))
}
