import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { ApiError } from './apiError.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /**
     * The drain before `close()`: keeps serving for up to `maxMillis`, every answer saying
     * `Connection: close`, and resolves early once no client connection has been open for a
     * moment (clients still sending reconnect after each answer: a gap between two of their
     * connections is not the end of their traffic).
     */
    drain(maxMillis: number): Promise<void>
  }
}

const DRAIN_CHECK_MILLIS = 100
/** How long without any connection open or opened ends a drain early. */
const DRAIN_QUIET_MILLIS = 500

/**
 * Closing without dropping anything. First the drain (`app.drain`, while the ops port already
 * says not ready): the service still answers everything, but with `Connection: close`, so
 * keep-alive clients take their next request elsewhere instead of sending it on a socket that
 * `close()` is about to destroy, and a load balancer has time to stop routing here. Then
 * `close()`: Fastify closes the connections that are idle, and a connection whose request was
 * still in flight is closed after its answer (which says `Connection: close`). A new request
 * that still arrives on an open connection gets the service's 503 Error body (Fastify's own
 * would not be the spec's shape).
 */
export const gracefulClose = fp(
  async (app: FastifyInstance, options: { unavailable: () => ApiError }) => {
    let closing = false
    let draining = false
    app.addHook('preClose', async () => {
      closing = true
    })
    app.addHook('onRequest', (_request, _reply, done) => {
      done(closing ? options.unavailable() : undefined)
    })
    app.addHook('onSend', (_request, reply, payload, done) => {
      if (draining || closing) reply.header('connection', 'close')
      done(null, payload)
    })
    app.decorate('drain', async (maxMillis: number) => {
      draining = true
      let lastBusy = performance.now()
      const connected = () => (lastBusy = performance.now())
      app.server.on('connection', connected)
      try {
        const until = lastBusy + maxMillis
        while (performance.now() < until) {
          const open = await new Promise<number>((resolve) => app.server.getConnections((error, count) => resolve(error ? 0 : count)))
          if (open > 0) lastBusy = performance.now()
          else if (performance.now() - lastBusy >= DRAIN_QUIET_MILLIS) return
          await new Promise((resolve) => setTimeout(resolve, Math.max(Math.min(DRAIN_CHECK_MILLIS, until - performance.now()), 0)))
        }
      } finally {
        app.server.off('connection', connected)
      }
    })
  },
  { name: 'graceful-close' },
)
