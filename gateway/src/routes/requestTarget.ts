import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'
import { gatewayErrors } from '../errors.ts'

/** Where a path that does not percent-decode is sent; it answers 400 after the whole pipeline. */
export const UNDECODABLE_PATH_ROUTE = '/v1/.undecodable-path'
/** Where a path with a `.` or `..` segment is sent; it answers 400 after the whole pipeline. */
export const DOT_SEGMENT_PATH_ROUTE = '/v1/.dot-segment-path'

/** `http://host:port` at the start of an absolute-form request target. */
const SCHEME_AND_AUTHORITY = /^https?:\/\/[^/?#]*/i

/**
 * The target the router sees, decided before it runs (Fastify's rewriteUrl):
 * - An absolute-form target (`GET http://host/v1/pets HTTP/1.1`) is routed by its path and
 *   query: a server must accept that form (RFC 9112 §3.2.2), and the router would refuse it.
 *   The gateway serves one origin, so the authority in it changes nothing.
 * - The router refuses a path whose percent-encoding does not decode (`/v1/pets/%zz`, invalid
 *   UTF-8) before any hook runs: no key check, no rate limit, no headers, no log fields. Such a
 *   path is sent to a route of its own instead, and its 400 goes through authentication and the
 *   limits like every other answer.
 * - A path with a `.` or `..` segment (`/v1/pets/./1`, `/v1/%2e%2e/pets`) is sent to a route of
 *   its own too, answered 400: each party on the way resolves such a path its own way or not at
 *   all (the router did not, the proxy's URL handling did), so the same request was one operation
 *   here, another or none there. No client needs one: RFC 3986 §5.2.4 removes them before sending.
 * An origin-form target without a `%` or `/.` (nearly all) costs three character checks.
 */
export function routeRequestTarget(request: IncomingMessage): string {
  const url = originForm(request.url ?? '/')
  const encoded = url.indexOf('%') >= 0
  if (!encoded && url.indexOf('/.') < 0) return url
  const queryAt = url.indexOf('?')
  const path = queryAt < 0 ? url : url.slice(0, queryAt)
  if (encoded) {
    try {
      decodeURIComponent(path)
    } catch {
      return UNDECODABLE_PATH_ROUTE
    }
  }
  return hasDotSegment(path) ? DOT_SEGMENT_PATH_ROUTE : url
}

/** Whether a path that percent-decodes has a segment that is `.` or `..`, written plainly or encoded. */
function hasDotSegment(path: string): boolean {
  for (const segment of path.split('/')) {
    if (segment.length === 0 || segment.length > 6) continue
    const decoded = segment.indexOf('%') < 0 ? segment : decodeURIComponent(segment)
    if (decoded === '.' || decoded === '..') return true
  }
  return false
}

/** The origin-form target the client sent, whatever the router was given instead. */
export function requestedTarget(request: { originalUrl: string }): string {
  return originForm(request.originalUrl)
}

function originForm(url: string): string {
  if (url.charCodeAt(0) === 0x2f /* / */) return url
  const authority = SCHEME_AND_AUTHORITY.exec(url)
  if (authority === null) return url
  const rest = url.slice(authority[0].length)
  return rest.charCodeAt(0) === 0x2f ? rest : `/${rest}`
}

/** The routes that answer the paths routeRequestTarget set aside. */
export async function refusedPathRoutes(app: FastifyInstance): Promise<void> {
  app.all(UNDECODABLE_PATH_ROUTE, async () => {
    throw gatewayErrors.create('bad_request', 'The request path is not valid percent-encoding.')
  })
  app.all(DOT_SEGMENT_PATH_ROUTE, async () => {
    throw gatewayErrors.create('bad_request', 'The request path may not hold "." or ".." segments; send the path they resolve to.')
  })
}
