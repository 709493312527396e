import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { ApiError } from './apiError.ts'

/**
 * The most header lines a client's request may carry: what Node's HTTP server has kept all along
 * (its maxHeadersCount is documented as 2,000, but left unset the parser keeps 1,000).
 */
export const MAX_HEADER_LINES = 1_000

/**
 * Node's HTTP server keeps so many header lines of a request and drops the rest without a word,
 * while its parser still frames the request by every line (Content-Length, Upgrade). A line past
 * the limit was seen by none of the checks made on the headers (a second Authorization or Host, an
 * Upgrade that must close the connection) and was not passed on: an Idempotency-Key past it was
 * lost, and a retried create stored a second pet. Node is told to keep one line more than the
 * limit: it drops lines only past its own count and keeps them in whole batches up to it, so
 * `rawHeaders` holds more than the limit's lines exactly when the client sent more.
 */
export function excessHeaderLines(request: IncomingMessage, limit = MAX_HEADER_LINES): boolean {
  return request.rawHeaders.length > 2 * limit
}

/**
 * Refuses a request with more than `limit` header lines (`refusal`, a 431) before any stage reads its
 * headers, and closes the connection after it. One length check per request.
 */
export const headerLineLimit = fp(
  async (app: FastifyInstance, options: { limit: number; refusal: () => ApiError }) => {
    app.server.maxHeadersCount = options.limit + 1
    app.addHook('onRequest', (request, reply, done) => {
      if (!excessHeaderLines(request.raw, options.limit)) return done()
      reply.header('connection', 'close')
      done(options.refusal())
    })
  },
  { name: 'header-line-limit' },
)
