import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/**
 * Fastify closes keep-alive connections that are idle when `close()` starts, but a connection
 * whose request was still in flight would stay open after its response and hold `close()`
 * until the keep-alive timeout. Answering with `Connection: close` once closing has begun lets
 * every in-flight request finish and then releases its socket.
 */
export const gracefulClose = fp(
  async (app: FastifyInstance) => {
    let closing = false
    app.addHook('preClose', async () => {
      closing = true
    })
    app.addHook('onSend', (_request, reply, payload, done) => {
      if (closing) reply.header('connection', 'close')
      done(null, payload)
    })
  },
  { name: 'graceful-close' },
)
