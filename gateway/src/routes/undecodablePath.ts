import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'
import { gatewayErrors } from '../errors.ts'

/** Where a path that does not percent-decode is sent; it answers 400 after the whole pipeline. */
export const UNDECODABLE_PATH_ROUTE = '/v1/.undecodable-path'

/**
 * The router refuses a path whose percent-encoding does not decode (`/v1/pets/%zz`, invalid
 * UTF-8) before any hook runs: no key check, no rate limit, no headers, no log fields. Fastify's
 * rewriteUrl runs before the router, so such a path is sent to a route of its own instead, and
 * its 400 goes through authentication and the limits like every other answer. URLs without a
 * `%` (nearly all) cost one indexOf.
 */
export function routeUndecodablePaths(request: IncomingMessage): string {
  const url = request.url ?? '/'
  if (url.indexOf('%') < 0) return url
  const queryAt = url.indexOf('?')
  const path = queryAt < 0 ? url : url.slice(0, queryAt)
  try {
    decodeURIComponent(path)
    return url
  } catch {
    return UNDECODABLE_PATH_ROUTE
  }
}

export async function undecodablePathRoute(app: FastifyInstance): Promise<void> {
  app.all(UNDECODABLE_PATH_ROUTE, async () => {
    throw gatewayErrors.create('bad_request', 'The request path is not valid percent-encoding.')
  })
}
