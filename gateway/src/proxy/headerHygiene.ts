import type { IncomingHttpHeaders } from 'node:http'
import type { FastifyRequest } from 'fastify'
import { knownAddress } from '../rateLimit/clientAddress.ts'

/*
 * Header hygiene at the proxy: what a client may not send on (the gateway's own headers and the
 * ones that would speak for it), what the gateway adds, and what of an upstream's answer stays
 * between the two (hop-by-hop headers, the upstream's software, invalid characters).
 */

/** The public prefix the pets-service builds its Location and Link headers with. */
const PUBLIC_PREFIX = '/v1'

/** Headers only the gateway may set; a client's copies are dropped before forwarding, an upstream's before answering. */
const INTERNAL_HEADERS = [
  'x-internal-token',
  'x-consumer-id',
  'x-forwarded-prefix',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
  'x-forwarded-port',
  'x-request-id',
]

/**
 * The other spellings of the client's address that servers, frameworks and CDNs read: RFC 7239
 * Forwarded, X-Real-IP (nginx), Client-IP (Rails), X-Client-IP, X-Cluster-Client-IP, X-Forwarded
 * and Forwarded-For (PHP's usual list), True-Client-IP (Akamai), CF-Connecting-IP (Cloudflare),
 * Fastly-Client-IP. Only the gateway says where a request came from (X-Forwarded-For).
 */
const ADDRESS_SPELLINGS = [
  'forwarded',
  'x-real-ip',
  'client-ip',
  'x-client-ip',
  'x-cluster-client-ip',
  'x-forwarded',
  'forwarded-for',
  'true-client-ip',
  'cf-connecting-ip',
  'fastly-client-ip',
]

/**
 * The method overrides some frameworks obey (Express's method-override, Spring's
 * HiddenHttpMethodFilter, ASP.NET, Symfony). The gateway judges a request by the method it was
 * sent with: a GET is resent once when its connection closes unanswered, requests pipelined
 * behind an unsafe one wait for its answer, TRACE is refused. An upstream that took a GET for a
 * DELETE would have had it done twice.
 */
const METHOD_OVERRIDES = ['x-http-method-override', 'x-http-method', 'x-method-override']

/**
 * A client's headers that would speak for the gateway or steer the upstream's routing: the other
 * spellings of the client's address, a credential meant for a proxy (Proxy-Authorization,
 * consumed here, RFC 9110 §11.7.2), the URL overrides some frameworks obey (X-Original-URL,
 * X-Rewrite-URL) and the method overrides. Dropped with the gateway-only ones, and with every
 * X-Forwarded-* field (isClientDropped). Via is not copied as it is but sent with the gateway
 * added to it (RFC 9110 §7.6.3; upstreamProxy).
 */
const CLIENT_DROPPED = new Set([...INTERNAL_HEADERS, ...ADDRESS_SPELLINGS, ...METHOD_OVERRIDES, 'proxy-authorization', 'x-original-url', 'x-rewrite-url', 'via'])

/** Fields a proxy says about the request it forwards; the gateway writes the ones it means itself. */
const FORWARDED_FIELD = 'x-forwarded-'

/**
 * Whether a client's header (its lower-case name) is dropped before forwarding: one of
 * CLIENT_DROPPED, or any X-Forwarded-* field. Beyond the five the gateway knows, upstream
 * frameworks read X-Forwarded-Ssl and X-Forwarded-Scheme (Rack, Spring: the client came over
 * HTTPS), X-Forwarded-Uri and X-Forwarded-Method (forward-auth middlewares), X-Forwarded-Server:
 * a client's copy would reach them as if the gateway had said it.
 */
export function isClientDropped(name: string): boolean {
  return CLIENT_DROPPED.has(name) || name.startsWith(FORWARDED_FIELD)
}

/**
 * Whether a client's header name with underscores (`X_Internal_Token`) is one of those dropped,
 * read with dashes: CGI and the servers that follow it (WSGI, PHP, Rack) give
 * `X-Consumer-Id` and `X_Consumer_Id` the one name HTTP_X_CONSUMER_ID, so an upstream written on
 * them could take the client's copy for the gateway's. Node keeps the two apart; an upstream that
 * is not the pets-service may not.
 */
export function spellsDropped(name: string): boolean {
  return isClientDropped(name.replaceAll('_', '-'))
}

/** An upstream's headers that are not the client's business: the internal ones, and what software it runs. */
export const ANSWER_DROPPED = new Set([...INTERNAL_HEADERS, 'server', 'x-powered-by'])

/** RFC 9110 §7.6.3: a gateway adds itself to Via on what it forwards. */
export const VIA = '1.1 aas-gateway'

/**
 * What only the gateway may say to the upstream: the internal credential (the upstream trusts it,
 * never the client's API key), the request id, the public prefix, the client's address and the
 * caller. The client's own copies of these are dropped where its headers are copied.
 */
export function gatewayHeaders(request: Pick<FastifyRequest, 'id' | 'ip' | 'apiKey'>, internalToken: string): IncomingHttpHeaders {
  const headers: IncomingHttpHeaders = {
    'x-internal-token': internalToken,
    'x-request-id': request.id,
    'x-forwarded-prefix': PUBLIC_PREFIX,
    'x-forwarded-for': knownAddress(request.ip),
    via: VIA,
  }
  if (request.apiKey) headers['x-consumer-id'] = request.apiKey.id
  return headers
}

// RFC 9110 §7.6.1: these describe the upstream connection, not the answer. Copied to the
// client they would, for one, keep open a connection the client asked to close.
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade']

export const HOP_BY_HOP_SET = new Set(HOP_BY_HOP)

/** RFC 7230 §6.1: a Connection header names more headers that only concern this hop (reply-from's getConnectionHeaders). */
export function connectionHeaderNames(value: unknown): string[] {
  if (typeof value !== 'string') return []
  const names: string[] = []
  for (const part of value.toLowerCase().split(',')) {
    const name = part.trim()
    if (name.length > 0) names.push(name)
  }
  return names
}

// HTAB, SP–~ and obs-text are valid in a header value; anything else would make Node throw when
// the answer is written (@fastify/http-proxy's sanitizeHeaders, applied as it did).
const INVALID_HEADER_VALUE = /[^\t\x20-\x7E\x80-\xFF]/
const INVALID_HEADER_CHARACTERS = /[^\t\x20-\x7E\x80-\xFF]/g

export function sanitizeHeaderValue(value: string): string {
  return INVALID_HEADER_VALUE.test(value) ? value.replace(INVALID_HEADER_CHARACTERS, '') : value
}
