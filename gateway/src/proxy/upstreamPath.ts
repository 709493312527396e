/** A path segment WHATWG URL parsing leaves exactly as it is: no `%`, no dot segment, nothing it encodes. */
const PLAIN_PATH = /^(?:\/(?!\.\.?(?:\/|$))[A-Za-z0-9\-._~!$&'()*+,;=:@]*)+$/

function invalidCharacters(): Error {
  return Object.assign(new Error('source/request contain invalid characters'), { statusCode: 400 })
}

/**
 * The upstream path for a destination http-proxy has already validated and rewritten, as
 * @fastify/reply-from's buildURL made it: dot segments refused, then WHATWG URL normalisation
 * (skipped when it would change nothing, which is the common case), a backslash kept as `%5C`.
 */
export function upstreamPathname(destination: string, base: string, baseHref: string): string {
  const decoded = decodeURIComponent(destination)
  if (decoded === '..' || decoded.includes('/..') || decoded.includes('../')) throw invalidCharacters()
  if (PLAIN_PATH.test(destination)) return destination
  // URL parsing reads a backslash as "/" in an http URL (and resolves the dot segments it then
  // makes): the upstream was asked for /pets/1/ where the gateway had routed the read of pet "1\.".
  let source = destination.includes('\\') ? destination.replaceAll('\\', '%5C') : destination
  if (source.length > 1 && source[0] === '/' && source[1] === '/') source = `.${source}`
  const url = new URL(source, base)
  const prefix = !baseHref.endsWith('/') && url.href.length > baseHref.length ? `${baseHref}/` : baseHref
  if (!url.href.startsWith(prefix)) throw new Error('source must be a relative path string')
  return url.pathname
}
