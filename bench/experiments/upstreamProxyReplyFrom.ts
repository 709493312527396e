// The proxy stage before tuning (gateway/src/proxy/upstreamProxy.ts at be0bd64): every request
// through @fastify/reply-from's reply.from. Kept for the gateway-reply-from experiment row only.
import type { IncomingHttpHeaders } from 'node:http'
import httpProxy from '@fastify/http-proxy'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { acceptOpaqueBodies } from '../../gateway/src/proxy/opaqueBodies.ts'
import { failureKind, upstreamFailure, type UpstreamFailureKind } from '../../gateway/src/proxy/upstreamFailure.ts'

export interface UpstreamOptions {
  /** e.g. http://127.0.0.1:3001 */
  url: string
  timeoutMillis: number
  internalToken: string
  /** Public path served, e.g. /v1/pets, and the upstream path it maps to, e.g. /pets. */
  publicPath: string
  upstreamPath: string
  observer?: UpstreamObserver
}

/** Upstream latency (request sent → response headers) and failures, for the metrics. */
export interface UpstreamObserver {
  response(upstream: string, status: number, seconds: number): void
  failure(upstream: string, kind: UpstreamFailureKind): void
}

/** The public prefix the pets-service builds its Location and Link headers with. */
export const PUBLIC_PREFIX = '/v1'

/** Headers only the gateway may set; a client's copies are dropped before forwarding. */
const INTERNAL_HEADERS = ['x-internal-token', 'x-consumer-id', 'x-forwarded-prefix', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-proto', 'x-request-id']

export function upstreamRequestHeaders(
  request: Pick<FastifyRequest, 'id' | 'ip' | 'apiKey'>,
  headers: IncomingHttpHeaders,
  internalToken: string,
): IncomingHttpHeaders {
  const forwarded: IncomingHttpHeaders = { ...headers }
  // The client's API key stays at the gateway; the upstream trusts the internal credential.
  delete forwarded.authorization
  for (const name of INTERNAL_HEADERS) delete forwarded[name]
  forwarded['x-internal-token'] = internalToken
  forwarded['x-request-id'] = request.id
  forwarded['x-forwarded-prefix'] = PUBLIC_PREFIX
  forwarded['x-forwarded-for'] = request.ip
  if (request.apiKey) forwarded['x-consumer-id'] = request.apiKey.id
  return forwarded
}

// RFC 9110 §7.6.1: these describe the upstream connection, not the answer. Copied to the
// client they would, for one, keep open a connection the client asked to close.
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade']

export function withoutHopByHop<T extends Record<string, unknown>>(headers: T): T {
  const named = typeof headers.connection === 'string' ? headers.connection.toLowerCase().split(',').map((name) => name.trim()) : []
  const copy = { ...headers }
  for (const name of [...HOP_BY_HOP, ...named]) delete copy[name]
  return copy
}

/**
 * Stage 4: a public prefix (`/v1/pets` and below) to its upstream. Bodies are read (at most
 * 1 MiB, else 413 before the upstream is contacted) and forwarded as they came; answers, the
 * upstream's Error bodies included, pass through unchanged.
 */
export async function upstreamProxy(app: FastifyInstance, options: UpstreamOptions): Promise<void> {
  acceptOpaqueBodies(app)
  const name = options.upstreamPath.split('/')[1] || 'upstream'
  // Upstream latency: request handed to the upstream → its response headers back.
  const sentAt = new WeakMap<object, number>()
  const waited = new WeakMap<object, number>()
  if (options.observer) {
    const observer = options.observer
    app.addHook('onResponse', async (request, reply) => {
      const seconds = waited.get(request)
      if (seconds !== undefined) observer.response(name, reply.statusCode, seconds)
    })
  }
  await app.register(httpProxy, {
    upstream: options.url,
    prefix: options.publicPath,
    rewritePrefix: options.upstreamPath,
    proxyPayloads: false,
    // The upstream writes Location and Link with the public prefix it is given.
    internalRewriteLocationHeader: false,
    disableRequestLogging: true,
    undici: {
      connections: 128,
      pipelining: 1,
      keepAliveTimeout: 60_000,
      headersTimeout: options.timeoutMillis,
      bodyTimeout: options.timeoutMillis,
    },
    replyOptions: {
      rewriteRequestHeaders: (request, headers) => {
        if (options.observer) sentAt.set(request, performance.now())
        return upstreamRequestHeaders(request, headers, options.internalToken)
      },
      rewriteHeaders: (headers, request) => {
        const started = request && sentAt.get(request)
        if (request && started !== undefined) waited.set(request, (performance.now() - started) / 1_000)
        return withoutHopByHop(headers)
      },
      onError: (reply, { error }) => {
        options.observer?.failure(name, failureKind(error))
        const failure = upstreamFailure(error)
        reply.log.warn({ err: error, code: failure.code }, 'upstream request failed')
        void reply.code(failure.status).headers(failure.headers).send(failure.toBody())
      },
      // Retrying is the client's decision (it has Retry-After); the gateway answers once.
      retryDelay: () => null,
      timeout: options.timeoutMillis,
    },
    handler: (request, reply, destination, replyOptions) => {
      const body = request.body
      if (Buffer.isBuffer(body)) {
        return reply.from(destination, {
          ...replyOptions,
          body,
          contentType: request.headers['content-type'] ?? 'application/octet-stream',
        })
      }
      return reply.from(destination, replyOptions)
    },
  })
}
