/** Readiness: the upstream answers HTTP at all (any status); a refused or silent one is down. */
export function upstreamAnswers(url: string, timeoutMillis = 1_000): () => Promise<void> {
  return async () => {
    const response = await fetch(new URL('/healthz', url), { signal: AbortSignal.timeout(timeoutMillis) })
    await response.body?.cancel()
  }
}
