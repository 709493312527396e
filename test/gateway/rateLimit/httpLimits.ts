import { expect } from 'vitest'
import { expectErrorResponse } from '../../helpers/assertions.ts'

/**
 * What a client reads from the gateway's rate-limit headers, and the assertions every
 * gateway-level rate-limit test shares.
 */
export interface ClientView {
  status: number
  limit: number
  remaining: number
  /** X-RateLimit-Reset, Unix seconds. */
  reset: number
  /** RateLimit-Policy: quota and window seconds per policy name. */
  policy: Map<string, { q: number; w: number }>
  /** RateLimit: remaining and seconds to reset per policy name. */
  current: Map<string, { r: number; t: number }>
  retryAfter: number | undefined
}

const INTEGER = /^\d+$/

function parseItems<K extends string>(header: string, fields: readonly K[]): Map<string, Record<K, number>> {
  const items = new Map<string, Record<K, number>>()
  for (const item of header.split(',').map((part) => part.trim())) {
    const [name, ...params] = item.split(';')
    const match = /^"([a-z]+)"$/.exec(name ?? '')
    expect(match, `item ${item} of ${header}`).not.toBeNull()
    const values = Object.fromEntries(params.map((param) => param.split('='))) as Record<string, string>
    for (const field of fields) expect(values[field], `${field} in ${item}`).toMatch(INTEGER)
    items.set(match![1]!, Object.fromEntries(fields.map((field) => [field, Number(values[field])])) as Record<K, number>)
  }
  return items
}

/**
 * Asserts the headers every /v1 answer carries and returns them parsed: X-RateLimit-* as
 * integers (Remaining never negative, Reset in Unix seconds near now), RateLimit-Policy and
 * RateLimit naming exactly `windows`.
 */
export function expectRateLimitHeaders(response: Response, windows: readonly string[]): ClientView {
  const header = (name: string) => {
    const value = response.headers.get(name)
    expect(value, `${name} on a ${response.status}`).not.toBeNull()
    return value!
  }
  const limit = header('x-ratelimit-limit')
  const remaining = header('x-ratelimit-remaining')
  const reset = header('x-ratelimit-reset')
  for (const value of [limit, remaining, reset]) expect(value).toMatch(INTEGER)
  const nowSeconds = Date.now() / 1_000
  // Unix seconds, not milliseconds and not a delta: within a day (plus a bucket) from now.
  expect(Number(reset)).toBeGreaterThanOrEqual(Math.floor(nowSeconds) - 2)
  expect(Number(reset)).toBeLessThanOrEqual(Math.ceil(nowSeconds) + 86_400 + 3_600 + 2)
  const policy = parseItems(header('ratelimit-policy'), ['q', 'w'] as const)
  const current = parseItems(header('ratelimit'), ['r', 't'] as const)
  expect([...policy.keys()]).toEqual(windows)
  expect([...current.keys()]).toEqual(windows)
  expect(Number(limit)).toBeGreaterThan(0)
  expect(Number(remaining)).toBeLessThanOrEqual(Number(limit))
  // X-RateLimit-* describe the window nearest exhaustion.
  const tightest = Math.min(...[...current.values()].map((window) => window.r))
  expect(Number(remaining)).toBe(tightest)
  const retryAfter = response.headers.get('retry-after')
  return {
    status: response.status,
    limit: Number(limit),
    remaining: Number(remaining),
    reset: Number(reset),
    policy,
    current,
    retryAfter: retryAfter === null ? undefined : Number(retryAfter),
  }
}

/** A 429 as the spec has it: Error body with `code`, Retry-After in whole seconds ≥ 1. */
export async function expectTooManyRequests(response: Response, code: 'rate_limited' | 'api_key_banned' = 'rate_limited'): Promise<number> {
  const retryAfter = response.headers.get('retry-after')
  expect(retryAfter, `Retry-After on a 429 ${code}`).toMatch(INTEGER)
  expect(Number(retryAfter)).toBeGreaterThanOrEqual(1)
  await expectErrorResponse(response, 429, code)
  return Number(retryAfter)
}

/** The Error body's code, or undefined for a success. Consumes the body. */
export async function codeOf(response: Response): Promise<string | undefined> {
  const text = await response.text()
  if (response.ok) return undefined
  return (JSON.parse(text) as { code?: string }).code
}

export const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/** Polls `probe` until it returns true or `timeoutMillis` passes; returns the time it took. */
export async function eventually(probe: () => Promise<boolean>, timeoutMillis: number, everyMillis = 100): Promise<number> {
  const started = performance.now()
  for (;;) {
    if (await probe()) return performance.now() - started
    if (performance.now() - started > timeoutMillis) throw new Error(`condition not met within ${timeoutMillis} ms`)
    await sleep(everyMillis)
  }
}

export const keyed = ['minute', 'day'] as const
export const anonymous = ['anonymous'] as const

/**
 * The Redis budget for tests that count exact outcomes. Production's 50 ms is the subject of
 * storeFaults.int.test.ts; elsewhere a loaded 2-core test machine can genuinely keep Redis from
 * answering for that long, which (by design) hands decisions to the per-process fallback.
 */
export const EXACT_OUTCOME_BUDGET_MILLIS = 1_000
