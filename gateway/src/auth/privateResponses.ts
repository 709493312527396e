import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/** Statuses a cache may keep without being told to (RFC 9110 §15.1, heuristically cacheable). */
const CACHEABLE_BY_DEFAULT = new Set([200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501])

/**
 * Answers to an authenticated request are that client's own (its pets, its quota): no shared
 * cache may keep them, whatever the upstream said. An answer without a key carries its client
 * address's quota and its request id: one a cache would keep unasked (a 404 for `/`, a 405, a
 * redirect) is told not to, unless its route chose its own caching (the docs files).
 */
export const privateResponses = fp(
  async (app: FastifyInstance) => {
    app.addHook('onSend', (request, reply, payload, done) => {
      // Every answer is what its Content-Type says: a browser that sniffed a pet's name
      // (`<script>…`) in a JSON answer as HTML would run it. Here, in a hook every answer passes.
      reply.header('x-content-type-options', 'nosniff')
      if (request.apiKey || (CACHEABLE_BY_DEFAULT.has(reply.statusCode) && !reply.hasHeader('cache-control'))) {
        reply.header('cache-control', 'no-store')
      }
      done(null, payload)
    })
  },
  { name: 'private-responses', dependencies: ['authenticate'] },
)
