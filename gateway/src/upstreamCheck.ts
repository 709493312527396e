import { request } from 'undici'
import { DependencyDown } from '../../common/src/ops/dependencyDown.ts'

/** The pets-service route that answers 204 to a request carrying an internal credential it accepts. */
export const AUTH_CHECK_PATH = '/auth-check'

/**
 * Readiness of the upstream: it answers GET /auth-check, sent with the gateway's internal
 * credential, with a 2xx. That proves more than "something listens": the pets-service accepts this
 * gateway, so a mismatched INTERNAL_TOKEN makes the gateway not ready instead of ready and
 * answering every request 502. The route touches no database and is not a client error on the
 * pets-service's side (an unauthenticated probe was logged and counted there as a 401).
 */
export function upstreamAcceptsGateway(url: string, internalToken: string, timeoutMillis = 1_000): () => Promise<void> {
  const target = new URL(AUTH_CHECK_PATH, url)
  return async () => {
    let status: number
    try {
      // undici's request, not fetch: fetch refuses the ports browsers block (6000, 6665–6669,
      // 10080 …), and an upstream on one was never ready although the proxy reached it.
      const response = await request(target, {
        headers: { 'x-internal-token': internalToken },
        signal: AbortSignal.timeout(timeoutMillis),
      })
      await response.body.dump()
      status = response.statusCode
    } catch (error) {
      throw new DependencyDown(`no answer from ${target.origin} (${errorCode(error)})`)
    }
    if (status >= 200 && status < 300) return
    if (status === 401 || status === 403) {
      throw new DependencyDown(
        `the upstream refuses the internal credential (${status}): INTERNAL_TOKEN differs between the gateway and the pets-service`,
      )
    }
    throw new DependencyDown(`the upstream answered ${status} to GET ${AUTH_CHECK_PATH}`)
  }
}

function errorCode(error: unknown): string {
  for (let current = error as { code?: unknown; cause?: unknown; name?: unknown } | undefined; current; current = current.cause as typeof current) {
    if (typeof current.code === 'string') return current.code
    if (current.name === 'TimeoutError') return 'timeout'
  }
  return 'no connection'
}
