import type { Server } from 'node:http'
import type { Socket } from 'node:net'

/**
 * What happens to a connection on which nothing has been read or written for the server's
 * `timeout` (Fastify's connectionTimeout, ClientTimeouts.stalledMillis), in place of Node's
 * default, which closes it whatever it is doing:
 *
 * - An answer is stuck on its way out (the client stopped reading): the connection is reset
 *   (plain TCP; over TLS it is closed).
 *   Closed the usual way, the kernel keeps the socket, and the megabytes queued in it, until the
 *   client reads them or its retries run out, minutes later, although the process let go of it:
 *   a client asking for the 1.7 MB docs bundle on a thousand connections and reading none pinned
 *   gigabytes of the host's TCP memory (nginx's reset_timedout_connection, for the same reason).
 * - A request is being answered and nothing is written yet (an upstream or Postgres is still at
 *   work): the connection is left alone, since the request's own deadline (the upstream's timeout,
 *   up to 300 s) bounds it; closed here, an upstream slower than this timeout could never answer.
 *   Unless the connection was ended already: that answer can never be sent.
 * - Nothing is under way: the connection is closed, as Node would.
 *
 * Node suppresses the first timeout of a connection whose last write was still going out, so a
 * stalled answer is cut after one to two times the timeout.
 */
export function cutStalledConnections(server: Server): void {
  server.on('timeout', (socket: Socket) => {
    if (socket.writableLength > 0) return reset(socket)
    // An answer can be under way only while the connection can still be written: one Node gave a
    // connection already ended (a refusal after a request's time ran out) is never sent.
    if (answering(socket) && socket.writable) return
    socket.destroy()
  })
}

/** The answer Node's HTTP server is writing on this connection, if any (set from a request's start to its answer's end). */
function answering(socket: Socket): boolean {
  const answer = (socket as Socket & { _httpMessage?: unknown })._httpMessage
  return answer !== null && answer !== undefined
}

/**
 * An RST and the socket gone. Over TLS the connection is closed the usual way: Node resets only a
 * socket that owns its TCP handle, and resetting the one under a TLS socket crashed the process.
 */
function reset(socket: Socket): void {
  try {
    socket.resetAndDestroy()
  } catch {
    socket.destroy()
  }
}
