import type { Socket } from 'node:net'

/** Per client connection, the callbacks waiting for it to close. */
const waiting = new WeakMap<Socket, Set<() => void>>()

/**
 * Calls `callback` when the connection closes, and returns what forgets it. Every request on a
 * connection shares one 'close' listener: one each made Node print MaxListenersExceededWarning
 * to stderr once a client pipelined more than ten, a line outside the JSON log that any client
 * could cause.
 */
export function onConnectionClose(socket: Socket, callback: () => void): () => void {
  let callbacks = waiting.get(socket)
  if (callbacks === undefined) {
    const set = new Set<() => void>()
    waiting.set(socket, set)
    socket.once('close', () => {
      waiting.delete(socket)
      for (const waiter of set) waiter()
    })
    callbacks = set
  }
  callbacks.add(callback)
  return () => callbacks.delete(callback)
}
