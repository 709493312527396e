import { setImmediate as setImmediatePromise, setTimeout as sleep } from 'node:timers/promises'
import type { ServerResponse } from 'node:http'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { ApiError } from './apiError.ts'

declare module 'fastify' {
  interface FastifyInstance {
    /** The drain before `close()`: keeps serving for `millis`, every answer saying `Connection: close`. */
    drain(millis: number): Promise<void>
  }
}

/**
 * Node gives a pipelined request's answer the socket only once the answers ahead of it are sent.
 * While draining, an answer ahead that has not sent its head yet will say `Connection: close`,
 * and the connection closes after it, so this one would never be sent: the request is not carried
 * out either (RFC 9112 §9.6), or a create would store a pet its client is never told about. Its
 * 503 is logged, never delivered. Behind an answer already under way with keep-alive (begun
 * before the drain), it is served as usual, and its own answer says close.
 */
function queuedBehindClosingAnswer(request: FastifyRequest, response: ServerResponse): boolean {
  if (response.socket !== null) return false
  // Node's own record of the answer the socket is writing (internal, stable since Node 0.x).
  const ahead = (request.raw.socket as { _httpMessage?: ServerResponse | null })._httpMessage
  return !ahead || !ahead.headersSent || !ahead.shouldKeepAlive
}

/**
 * Closing without dropping anything. First the drain (`app.drain`, while the ops port already
 * says not ready): the service still answers everything, but with `Connection: close`, so a load
 * balancer has time to see /readyz fail and stop routing here, and keep-alive clients take their
 * next request elsewhere instead of sending it on a socket that `close()` is about to destroy (a
 * reset). It lasts its whole length: a quiet moment on the API port says nothing about whether
 * the load balancer has noticed yet. Then `close()`: Fastify closes the connections that are
 * idle, and a connection whose request was still in flight is closed after its answer (which
 * says `Connection: close`). A new request that still arrives on an open connection gets the
 * service's 503 Error body (Fastify's own would not be the spec's shape).
 */
export const gracefulClose = fp(
  async (app: FastifyInstance, options: { unavailable: () => ApiError }) => {
    let closing = false
    let draining = false
    app.addHook('preClose', async () => {
      closing = true
      // Answers already made but held until the end of this turn (coalescedWrites) leave first:
      // their connections are then idle when the server closes, and closed with it. Written after
      // it, such an answer would keep its connection open (it said keep-alive) until the client
      // left, and close() would wait for that.
      await setImmediatePromise()
    })
    app.addHook('onRequest', (request, reply, done) => {
      done(closing || (draining && queuedBehindClosingAnswer(request, reply.raw)) ? options.unavailable() : undefined)
    })
    app.addHook('onSend', (_request, reply, payload, done) => {
      if (draining || closing) reply.header('connection', 'close')
      done(null, payload)
    })
    app.decorate('drain', async (millis: number) => {
      draining = true
      if (millis > 0) await sleep(millis)
    })
  },
  { name: 'graceful-close' },
)
