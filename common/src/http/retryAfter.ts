/** A Retry-After that each answer draws anew from a range of whole seconds (at least 1). */
export interface RetryAfterSpread {
  min: number
  max: number
}

/**
 * Whole seconds drawn uniformly from the range on each call. With one fixed value every client
 * refused during an outage that honours it comes back in step, the herd arriving together just
 * as the dependency recovers.
 */
export function spreadRetryAfterSeconds({ min, max }: RetryAfterSpread): number {
  return min + Math.floor(Math.random() * (max - min + 1))
}

/**
 * One answer per second of the range, built once, and a draw among them on each call: for a
 * refusal answered many times a second, serialised once per value instead of once per request.
 */
export function spreadAnswers<T>(range: RetryAfterSpread, build: (retryAfter: string) => T): () => T {
  const answers: T[] = []
  for (let seconds = range.min; seconds <= range.max; seconds++) answers.push(build(String(seconds)))
  return () => answers[spreadRetryAfterSeconds(range) - range.min] as T
}
