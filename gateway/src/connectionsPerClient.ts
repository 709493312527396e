import type { Server, Socket } from 'node:net'
import type { FastifyBaseLogger } from 'fastify'
import { Counter, type Registry } from 'prom-client'
import { anonymousBucket } from './rateLimit/clientAddress.ts'

/** At most one log line in this time, carrying the refusals since the line before. */
const REFUSAL_LOG_INTERVAL_MILLIS = 60_000

export interface ConnectionsPerClientOptions {
  /** The most connections one client address holds at once (an IPv6 client: its /64, as the per-IP limit counts it). */
  limit: number
  /** A configured load balancer, whose connections carry many clients' requests and are not capped. */
  isTrustedProxy: (address: string) => boolean
  registry: Registry
  logger: Pick<FastifyBaseLogger, 'warn'>
}

/**
 * Connections past `limit` from one client address are closed as soon as they are accepted,
 * unread, as the listener's own cap closes those past it (connectionCap.ts). Without this, one
 * address could take the whole cap: a client refused by the per-IP limit, or with no key at all,
 * kept each connection for the 72 s keep-alive after one cheap request, and every new client,
 * keyed or not, was reset while it held them.
 */
export function capConnectionsPerClient(server: Server, options: ConnectionsPerClientOptions): void {
  const held = new Map<string, number>()
  const refused = new Counter({
    name: 'gateway_client_connections_refused_total',
    help: 'Client connections closed as soon as accepted because their address already held server.maxConnectionsPerClient.',
    registers: [options.registry],
  })
  let loggedAt = -Infinity
  let unlogged = 0

  const refuse = (socket: Socket, client: string) => {
    socket.destroy()
    refused.inc()
    unlogged++
    if (Date.now() - loggedAt < REFUSAL_LOG_INTERVAL_MILLIS) return
    options.logger.warn(
      { client, maxConnectionsPerClient: options.limit, refused: unlogged },
      'a client address held as many connections as one may (server.maxConnectionsPerClient): more were closed unread',
    )
    loggedAt = Date.now()
    unlogged = 0
  }

  // Ahead of the HTTP (or TLS) server's own listener: a refused socket is gone before it reads.
  server.prependListener('connection', (socket: Socket) => {
    const address = socket.remoteAddress
    if (address === undefined || options.isTrustedProxy(address)) return
    const client = anonymousBucket(address)
    const count = (held.get(client) ?? 0) + 1
    if (count > options.limit) return refuse(socket, client)
    held.set(client, count)
    socket.once('close', () => {
      const left = (held.get(client) ?? 1) - 1
      if (left === 0) held.delete(client)
      else held.set(client, left)
    })
  })
}
