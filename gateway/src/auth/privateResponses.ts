import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/**
 * Answers to an authenticated request are that client's own (its pets, its quota): no shared
 * cache may keep them, whatever the upstream said.
 */
export const privateResponses = fp(
  async (app: FastifyInstance) => {
    app.addHook('onSend', (request, reply, payload, done) => {
      if (request.apiKey) reply.header('cache-control', 'no-store')
      done(null, payload)
    })
  },
  { name: 'private-responses', dependencies: ['authenticate'] },
)
