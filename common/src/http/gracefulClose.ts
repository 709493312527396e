import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { ApiError } from './apiError.ts'

/**
 * Closing without dropping anything. Fastify closes keep-alive connections that are idle when
 * `close()` starts, but a connection whose request was still in flight would stay open after
 * its response and hold `close()` until the keep-alive timeout: once closing has begun every
 * answer says `Connection: close`. A new request that still arrives on an open connection gets
 * the service's 503 Error body (Fastify's own would not be the spec's shape).
 */
export const gracefulClose = fp(
  async (app: FastifyInstance, options: { unavailable: () => ApiError }) => {
    let closing = false
    app.addHook('preClose', async () => {
      closing = true
    })
    app.addHook('onRequest', (_request, _reply, done) => {
      done(closing ? options.unavailable() : undefined)
    })
    app.addHook('onSend', (_request, reply, payload, done) => {
      if (closing) reply.header('connection', 'close')
      done(null, payload)
    })
  },
  { name: 'graceful-close' },
)
