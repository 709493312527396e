import type { WindowState } from './limitStore.ts'

export interface NamedWindow extends WindowState {
  /** "minute", "day" or "anonymous": the policy name in the IETF fields. */
  name: string
  windowSeconds: number
}

/**
 * The window the X-RateLimit-* headers name: the one nearest exhaustion, with the fewest requests
 * left; of two with as many, the one that frees last, which is when the client is really held
 * back until.
 */
function nearestExhaustion(windows: readonly WindowState[]): number {
  let nearest = 0
  for (let index = 1; index < windows.length; index++) {
    const window = windows[index]!
    const held = windows[nearest]!
    if (window.remaining < held.remaining || (window.remaining === held.remaining && window.resetMillis > held.resetMillis)) nearest = index
  }
  return nearest
}

/**
 * The spec's X-RateLimit-* headers for the window nearest exhaustion (or the one `named`), and the
 * IETF draft's RateLimit-Policy / RateLimit fields (draft-ietf-httpapi-ratelimit-headers) for
 * every window.
 */
export function rateLimitHeaders(windows: NamedWindow[], nowMillis: number, named = nearestExhaustion(windows)): Record<string, string> {
  // Plain loops: this runs on every /v1 answer, and under tsx every closure created per call is
  // also renamed per call (esbuild's keepNames), which showed in profiles of the refusal paths.
  const tightest = windows[named] as NamedWindow
  let policy = ''
  let current = ''
  for (const window of windows) {
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
