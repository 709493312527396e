import { readFileSync } from 'node:fs'
import type { Server } from 'node:net'
import type { Logger } from 'pino'

/**
 * File descriptors a service process holds besides its client connections and its pools: stdio,
 * libuv's own (epoll, wake-up and signal descriptors, the spare it frees to shed connections at
 * EMFILE), the log, DNS lookups, the config watch, Redis (one connection, or one per Cluster node),
 * the readiness probe's upstream call.
 */
export const BASE_RESERVED_FDS = 64

/**
 * The ops port's cap. Its clients are a few scrapers and probers; past it, one more is refused
 * rather than letting a flood of the ops port take the descriptors the public port and the
 * process's own connections need. Counted in every service's reserve.
 */
export const OPS_MAX_CONNECTIONS = 64

/** The public port's cap where the open-file limit cannot be read (not Linux). */
export const FALLBACK_MAX_CONNECTIONS = 4_096

/** The least a derived cap allows, whatever the limit: below it the service could not serve at all. */
export const MIN_MAX_CONNECTIONS = 64

/**
 * The process's open-file limit (the soft one, which Node raises to the hard one at start), read
 * from /proc/self/limits; undefined where there is no such file or it says nothing usable.
 */
export function openFileLimit(readLimits: () => string = () => readFileSync('/proc/self/limits', 'utf8')): number | undefined {
  try {
    const match = /^Max open files\s+(\d+)\s/m.exec(readLimits())
    return match ? Number(match[1]) : undefined
  } catch {
    return undefined
  }
}

export interface ConnectionBudget {
  /** The most client connections the public port holds at once. */
  maxConnections: number
  /** How it was chosen: set by the operator, derived from the open-file limit, or the fixed fallback. */
  source: 'configured' | 'open-file limit' | 'fallback'
  openFileLimit?: number
  /** Descriptors kept out of the public port's reach: BASE_RESERVED_FDS, the ops port and the service's outbound connections. */
  reservedFds: number
  /** Set when the open-file limit leaves the public port fewer connections than it is given (or MIN_MAX_CONNECTIONS). */
  overLimit?: boolean
}

/**
 * Every accepted connection takes a file descriptor. Without a cap, clients that open connections
 * and keep them (idle, keep-alive, headers dribbled) can take all of the process's descriptors:
 * then the service cannot connect to Postgres, Redis or its upstream (requests on connections it
 * already holds fail with 500 or 502), and libuv accepts and closes every new connection at once,
 * the ops port's probes and scrapes included. The cap keeps `reservedFds` out of clients' reach.
 */
export function connectionBudget(options: { configured?: number; outboundConnections: number; openFileLimit?: number }): ConnectionBudget {
  const reservedFds = BASE_RESERVED_FDS + OPS_MAX_CONNECTIONS + options.outboundConnections
  const limit = options.openFileLimit
  const room = limit === undefined ? undefined : limit - reservedFds
  if (options.configured !== undefined) {
    return { maxConnections: options.configured, source: 'configured', openFileLimit: limit, reservedFds, overLimit: room !== undefined && options.configured > room }
  }
  if (room === undefined) return { maxConnections: FALLBACK_MAX_CONNECTIONS, source: 'fallback', reservedFds }
  return { maxConnections: Math.max(room, MIN_MAX_CONNECTIONS), source: 'open-file limit', openFileLimit: limit, reservedFds, overLimit: room < MIN_MAX_CONNECTIONS }
}

/**
 * Applies the cap: Node closes each connection past `maxConnections` as soon as it is accepted,
 * without reading from it (the client sees the connection closed or reset), and emits 'drop'
 * (counted by connectionMetrics.ts). Says at start what the cap is and where it came from, and
 * warns when the open-file limit cannot back it.
 */
export function capConnections(server: Server, budget: ConnectionBudget, logger: Pick<Logger, 'info' | 'warn'>, variable: string): void {
  server.maxConnections = budget.maxConnections
  const fields = { maxConnections: budget.maxConnections, source: budget.source, openFileLimit: budget.openFileLimit, reservedFds: budget.reservedFds }
  if (budget.overLimit) {
    logger.warn(
      fields,
      `the open-file limit (${budget.openFileLimit}) leaves fewer than ${budget.maxConnections} descriptors for client connections beside the ${budget.reservedFds} ` +
        `kept for the process's own connections (its Postgres pool, and on the gateway Redis and the upstreams) and the ops port: raise it (ulimit -n, LimitNOFILE, --ulimit nofile) or lower ${variable}`,
    )
  } else {
    logger.info(fields, `the public port holds at most ${budget.maxConnections} client connections at once; more are closed as soon as they are accepted`)
  }
}
