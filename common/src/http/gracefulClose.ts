import { setImmediate as setImmediatePromise, setTimeout as sleep } from 'node:timers/promises'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { Server as TlsServer } from 'node:tls'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
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
 * While draining, every answer says `Connection: close`, and the connection closes after it: a
 * request queued behind one whose answer has not begun, or behind another request let through
 * during the drain, would never be answered, so it is not carried out either (RFC 9112 §9.6), or
 * a create would store a pet its client is never told about. Its 503 is logged, never delivered.
 * Behind an answer already under way with keep-alive (begun before the drain), it is served, and
 * its own answer says close. `letThrough` holds the sockets that had a request let through while
 * draining (only called then).
 */
function queuedBehindClosingAnswer(request: FastifyRequest, response: ServerResponse, letThrough: WeakSet<object>): boolean {
  const socket = request.raw.socket
  if (response.socket === null) {
    if (letThrough.has(socket)) return true
    // Node's own record of the answer the socket is writing (internal, stable since Node 0.x).
    const ahead = (socket as { _httpMessage?: ServerResponse | null })._httpMessage
    if (!ahead || !ahead.headersSent || !ahead.shouldKeepAlive) return true
  }
  letThrough.add(socket)
  return false
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
/** How often, once closing, connections with no answer under way are closed (closeQuietConnections). */
const QUIET_CONNECTION_SWEEP_MILLIS = 250

/**
 * Node's `close()` closes idle keep-alive connections, but counts one that has not sent a whole
 * request yet (a load balancer's pre-opened connection, a client that connected and went quiet)
 * as busy, and stops the header timeouts that would have ended it: three such connections held a
 * shutdown to its deadline (15 s). Once closing, every connection with no answer under way is
 * closed, until the server has closed; one whose request is being answered finishes first.
 *
 * A request whose body is still arriving is not being answered yet: nothing is carried out before
 * the body is whole (the gateway forwards it whole, a service parses it whole). Left alone, one
 * client sending slowly, or not at all, held the close until its request timeout (30 s), past the
 * shutdown's deadline (15 s): the exit was forced, the steps after the close never ran. It gets
 * `refuseUnfinished`'s answer (503, retry), on a connection that then closes.
 */
export function closeQuietConnections(app: FastifyInstance, refuseUnfinished: (request: IncomingMessage) => void): () => void {
  const connections = new Set<Socket>()
  // Over TLS the HTTP layer writes on the TLS socket, which 'secureConnection' gives. A connection
  // whose handshake has not finished (a load balancer's pre-opened one, a client gone quiet) has
  // sent no request either: left to its handshake timeout, it held a shutdown 10 s.
  const overTls = app.server instanceof TlsServer
  const handshaking = new Set<Socket>()
  app.server.on(overTls ? 'secureConnection' : 'connection', (socket: Socket) => {
    if (overTls) handshaking.delete((socket as Socket & { _parent?: Socket })._parent as Socket)
    connections.add(socket)
    socket.once('close', () => connections.delete(socket))
  })
  if (overTls) {
    app.server.on('connection', (socket: Socket) => {
      handshaking.add(socket)
      socket.once('close', () => handshaking.delete(socket))
    })
  }
  return () => {
    const sweep = () => {
      for (const socket of handshaking) socket.destroy()
      for (const socket of connections) {
        // Node's own record of the answer the socket is writing (internal, stable since Node 0.x).
        const answer = (socket as { _httpMessage?: ServerResponse | null })._httpMessage
        if (!answer) socket.destroy()
        else if (!answer.headersSent && !answer.req.complete) refuseUnfinished(answer.req)
      }
    }
    const sweeping = setInterval(sweep, QUIET_CONNECTION_SWEEP_MILLIS).unref()
    app.server.once('close', () => clearInterval(sweeping))
    sweep()
  }
}

/**
 * The reply of each request, on its raw request, for a close that finds its body still arriving.
 * A property, not a WeakMap: on every request, a WeakMap's set cost about 130 ns, this about 1.
 */
const REPLY = Symbol('reply')
type WithReply = IncomingMessage & { [REPLY]?: FastifyReply }

export const gracefulClose = fp(
  async (app: FastifyInstance, options: { unavailable: () => ApiError }) => {
    let closing = false
    let draining = false
    const startClosingQuietConnections = closeQuietConnections(app, (raw) => {
      const reply = (raw as WithReply)[REPLY]
      if (reply === undefined || reply.sent) return
      reply.header('connection', 'close').send(options.unavailable())
    })
    app.addHook('preClose', async () => {
      closing = true
      // Answers already made but held until the end of this turn (coalescedWrites) leave first:
      // their connections are then idle when the server closes, and closed with it. Written after
      // it, such an answer would keep its connection open (it said keep-alive) until the client
      // left, and close() would wait for that.
      await setImmediatePromise()
      startClosingQuietConnections()
    })
    const letThroughWhileDraining = new WeakSet<object>()
    app.addHook('onRequest', (request, reply, done) => {
      ;(request.raw as WithReply)[REPLY] = reply
      const refuse = closing || (draining && queuedBehindClosingAnswer(request, reply.raw, letThroughWhileDraining))
      done(refuse ? options.unavailable() : undefined)
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
