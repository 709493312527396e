import { readFileSync } from 'node:fs'
import { isIP } from 'node:net'
import type { Logger } from 'pino'
import { hasUnencodedAt } from './database/printableUrl.ts'

/** A setting the environment gives wrongly or not at all: the process cannot start, and the message says why. */
export class EnvError extends Error {}

/**
 * How a service that could not start says so: an operator's mistake in the environment in one
 * line (log and stderr), without a stack trace; anything else as the fatal error it is.
 */
export function reportStartupFailure(logger: Logger, service: string, error: unknown): void {
  if (error instanceof EnvError) {
    logger.fatal({ problem: error.message }, `${service} cannot start`)
    console.error(`${service} cannot start: ${error.message}`)
  } else {
    logger.fatal({ err: error }, `${service} failed to start`)
  }
}

/**
 * Listens, and when the address cannot be had says which setting to change: a port another
 * process holds, a privileged port, a host that is not this machine's. Node's own error was a
 * stack trace naming no variable, after the other listener and the migrations had gone ahead.
 */
export async function listenOrSay(listen: () => Promise<unknown>, where: { host: string; port: number; hostSetting: string; portSetting: string }): Promise<void> {
  try {
    await listen()
  } catch (error) {
    const code = (error as NodeJS.ErrnoException | null)?.code
    const address = `${where.host.includes(':') ? `[${where.host}]` : where.host}:${where.port}`
    if (code === 'EADDRINUSE') throw new EnvError(`${address} is in use by another process: stop it, or set ${where.portSetting} to a free port`)
    if (code === 'EACCES') throw new EnvError(`${address} may not be listened on by this user (ports below 1024 need privileges): set ${where.portSetting} to 1024 or above`)
    if (code === 'EADDRNOTAVAIL') throw new EnvError(`${where.host} is not an address of this machine: set ${where.hostSetting} to one that is (0.0.0.0: all of them)`)
    throw error
  }
}

/** Where a port variable cannot take 0 (any free port), and why: said in the one message for every wrong value. */
export interface NoFreePort {
  why: string
}

/** Reads a TCP port from the environment; a malformed value stops the process at boot. */
export function portFromEnv(name: string, fallback: number, env: NodeJS.ProcessEnv = process.env, noFreePort?: NoFreePort): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  const port = /^\d{1,5}$/.test(raw) ? Number(raw) : Number.NaN
  const lowest = noFreePort ? 1 : 0
  if (!(port >= lowest && port <= 65_535)) {
    const why = noFreePort ? ` (${noFreePort.why})` : ''
    throw new EnvError(`${name} must be a port number between ${lowest} and 65535${why}, got "${raw}"`)
  }
  return port
}

/** A host name: dot-separated labels of letters, digits, inner hyphens and underscores (which container networks' service names may carry). */
const HOST_NAME = /^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$/

/**
 * What is wrong with `host` as an address to listen on, or undefined: it must be an IP address
 * (IPv6 without brackets) or a host name. Anything else (`0.0.0.0:8080`, `[::1]`) would stop the
 * service at start with getaddrinfo ENOTFOUND and no word of which setting it came from.
 */
export function listenHostProblem(host: string): string | undefined {
  if (isIP(host) !== 0 || HOST_NAME.test(host)) return undefined
  if (host.startsWith('[')) return 'must be an IP address or a host name; an IPv6 address takes no brackets here'
  return host.includes(':') ? 'must be an IP address or a host name; a port goes in its own setting' : 'must be an IP address or a host name'
}

/**
 * Whether two listeners on one port would take the same address: the same host, `::` (every
 * address, IPv4 too, on a dual-stack host) beside anything, or `0.0.0.0` beside an IPv4 one.
 * Host names are compared as written; what they resolve to is not known here. Port 0 is any free
 * port, a different one for each.
 */
export function listenersCollide(a: { host: string; port: number }, b: { host: string; port: number }): boolean {
  const everyAddress = (host: string) => host === '::' || host === '[::]'
  const everyIpv4 = (host: string) => host === '0.0.0.0'
  const ipv4 = (host: string) => /^\d{1,3}(\.\d{1,3}){3}$/.test(host)
  const sameAddress =
    a.host === b.host || everyAddress(a.host) || everyAddress(b.host) || (everyIpv4(a.host) && ipv4(b.host)) || (everyIpv4(b.host) && ipv4(a.host))
  return a.port !== 0 && a.port === b.port && sameAddress
}

/**
 * A service's public and ops listeners on one address, said naming the settings that set their
 * ports; undefined when they can both listen. Without it the second listener failed at start with
 * EADDRINUSE and a stack trace that named no variable.
 */
export function listenersCollideProblem(
  api: { host: string; port: number; portName: string },
  ops: { host: string; port: number; portName: string },
): string | undefined {
  if (!listenersCollide(api, ops)) return undefined
  return `${ops.portName} must differ from ${api.portName} (both ${api.port}): the ops and public listeners would take one address`
}

/**
 * What is wrong with `url` as an http(s) URL, or undefined. The WHATWG parser judges, as it is the
 * one that refuses the value later (a port over 65535, an unclosed IPv6 bracket).
 */
export function httpUrlProblem(url: string): string | undefined {
  const scheme = urlScheme(url)
  if (scheme === undefined) return 'must be a valid http:// or https:// URL (is the port 1-65535? is every [ closed?)'
  return scheme === 'http:' || scheme === 'https:' ? undefined : 'must be an http:// or https:// URL'
}

/**
 * Why `url` cannot be an upstream's (PETS_URL, upstreams.<name>.url), or undefined: an http(s)
 * origin and nothing more. The gateway sends each request's own path (`/pets/7`) and no
 * credential of the URL's, so a base path, a query or a `user:password` would be dropped
 * without a word (and a path the parser normalises failed 500).
 */
export function upstreamUrlProblem(url: string): string | undefined {
  const problem = httpUrlProblem(url)
  if (problem) return problem
  const { username, password, pathname, search, hash } = new URL(url)
  if (username || password || pathname !== '/' || search || hash || url.endsWith('?') || url.endsWith('#')) {
    return 'must be an http:// or https:// origin only (scheme, host, port): the gateway sends no path, query or user:password of it'
  }
  return undefined
}

/** The scheme (`https:`) of a URL the WHATWG parser accepts; undefined for anything else. */
export function urlScheme(url: string): string | undefined {
  try {
    return new URL(url).protocol
  } catch {
    return undefined
  }
}

/** A host name or address to listen on from the environment; a malformed value stops the process at boot. */
export function listenHostFromEnv(name: string, fallback: string, env: NodeJS.ProcessEnv = process.env): string {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  const problem = listenHostProblem(raw)
  if (problem) throw new EnvError(`${name} ${problem} (got "${raw}")`)
  return raw
}

/**
 * DATABASE_URL: a `postgres://` or `postgresql://` URL, pg's `socket:` form or a socket directory
 * (`/var/run/postgresql dbname`). Judged by its scheme alone, as pg parses it: a URL WHATWG
 * refuses can still be one pg takes (`postgres://user:pw@/db?host=/cloudsql/…`, a socket with
 * credentials). pg reads anything else as a path under a made-up host, and the service would
 * wait for a host named "base" for ever.
 */
export function databaseUrlFromEnv(env: NodeJS.ProcessEnv = process.env): string {
  const raw = requiredEnv('DATABASE_URL', env)
  if (!/^(?:postgres|postgresql|socket):/i.test(raw) && !raw.startsWith('/')) {
    throw new EnvError('DATABASE_URL must be a postgres:// URL, e.g. postgres://user@127.0.0.1:5432/db (it is set, but is not one)')
  }
  if (hasUnencodedAt(raw)) {
    throw new EnvError(
      "DATABASE_URL holds an '@' after its host: percent-encode '@', '/', '?' and '#' in the user name and password (%40, %2F, %3F, %23), or give the password in PGPASSWORD; a database name with '@' goes in PGDATABASE, the URL naming none (the URL is not printed)",
    )
  }
  const unreadable = unreadableSslFile(raw)
  if (unreadable) throw new EnvError(unreadable)
  return raw
}

/** The files a connection string names for pg to read at each new connection, by parameter (percent-decoded, as pg reads them). */
export function sslFilesOf(url: string): [string, string][] {
  const start = url.indexOf('?')
  if (start < 0) return []
  const parameters = new URLSearchParams(url.slice(start + 1).split('#')[0])
  return SSL_FILE_PARAMETERS.flatMap((name) => {
    const file = parameters.get(name)
    return file ? [[name, file] as [string, string]] : []
  })
}

/** A connection string without the parameters pg reads as files (sslrootcert, sslcert, sslkey). */
export function withoutSslFiles(url: string | undefined): string | undefined {
  const start = url?.indexOf('?') ?? -1
  if (url === undefined || start < 0) return url
  const [query, ...fragment] = url.slice(start + 1).split('#')
  const parameters = new URLSearchParams(query)
  for (const name of SSL_FILE_PARAMETERS) parameters.delete(name)
  return `${url.slice(0, start + 1)}${parameters.toString()}${fragment.length > 0 ? `#${fragment.join('#')}` : ''}`
}

/** The URL parameters whose value pg reads as a file each time it makes a connection. */
const SSL_FILE_PARAMETERS = ['sslrootcert', 'sslcert', 'sslkey']

/**
 * pg reads sslrootcert, sslcert and sslkey as it makes each client, and throws there when one
 * cannot be read: the services stopped with a stack trace (from the code that words Postgres's
 * refusals). Said at start instead, naming the parameter, its path and why (never the contents).
 * The query is read as pg reads it (URLSearchParams: percent-decoded, `+` a space).
 */
function unreadableSslFile(url: string): string | undefined {
  for (const [name, file] of sslFilesOf(url)) {
    try {
      readFileSync(file)
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message
      return `DATABASE_URL's ${name} cannot be read: ${file} (${code}); pg reads it at every new connection`
    }
  }
  return undefined
}

/** Default DATABASE_POOL_SIZE: connections each service process keeps to Postgres at most. */
export const DEFAULT_POOL_SIZE = 10

/**
 * DATABASE_POOL_SIZE (1–1000): the most connections one service process opens to Postgres. Every
 * replica takes this many from the server's max_connections (100 by default), so an operator
 * adding replicas on a shared Postgres lowers it; a malformed value stops the process at boot.
 */
export function poolSizeFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  return connectionCountFromEnv('DATABASE_POOL_SIZE', 1_000, env) ?? DEFAULT_POOL_SIZE
}

/** A whole number of connections from 1 to `max`, or undefined when unset; anything else stops the process by name. */
function connectionCountFromEnv(name: string, max: number, env: NodeJS.ProcessEnv): number | undefined {
  const raw = env[name]
  if (raw === undefined || raw === '') return undefined
  const count = Number(raw)
  if (!/^\d+$/.test(raw) || count < 1 || count > max) {
    throw new EnvError(`${name} must be a whole number of connections from 1 to ${max}, got "${raw}"`)
  }
  return count
}

export function requiredEnv(name: string, env: NodeJS.ProcessEnv = process.env): string {
  const value = env[name]
  if (value === undefined || value === '') throw new EnvError(`${name} must be set`)
  return value
}

/** Shortest INTERNAL_TOKEN either service accepts: the credential that stands between the network and the catalogue. */
export const INTERNAL_TOKEN_MIN_LENGTH = 16

/** INTERNAL_TOKEN, which the gateway presents and the pets-service checks; both refuse to start on a short one. */
export function internalTokenFromEnv(env: NodeJS.ProcessEnv = process.env): string {
  return longEnough('INTERNAL_TOKEN', requiredEnv('INTERNAL_TOKEN', env))
}

/**
 * ORDERS_INTERNAL_TOKEN: the credential the gateway presents to the orders upstream
 * (upstreams.orders), its own. INTERNAL_TOKEN lets its holder call the pets-service as the gateway:
 * sent to the orders service too, whoever runs that service (or the host at its address) could.
 */
export function ordersTokenFromEnv(env: NodeJS.ProcessEnv = process.env): string {
  if (!env.ORDERS_INTERNAL_TOKEN) {
    throw new EnvError(
      'ORDERS_INTERNAL_TOKEN must be set when config/gateway.yaml names upstreams.orders: the credential the gateway ' +
        'presents to the orders service (its own; the pets-service\'s INTERNAL_TOKEN is never sent there)',
    )
  }
  const token = longEnough('ORDERS_INTERNAL_TOKEN', env.ORDERS_INTERNAL_TOKEN)
  if (token === env.INTERNAL_TOKEN || token === env.INTERNAL_TOKEN_PREVIOUS) {
    throw new EnvError('ORDERS_INTERNAL_TOKEN must differ from INTERNAL_TOKEN: the orders service must not hold the pets-service\'s credential')
  }
  return token
}

/** INTERNAL_TOKEN_PREVIOUS (pets-service): the credential also accepted while INTERNAL_TOKEN is rotated. */
export function previousInternalTokenFromEnv(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const token = env.INTERNAL_TOKEN_PREVIOUS
  return token ? longEnough('INTERNAL_TOKEN_PREVIOUS', token) : undefined
}

function longEnough(name: string, token: string): string {
  if (token.length < INTERNAL_TOKEN_MIN_LENGTH) throw new EnvError(`${name} must be at least ${INTERNAL_TOKEN_MIN_LENGTH} characters`)
  // It travels as a header value: HTTP parsers trim spaces around one, and undici refuses
  // characters beyond latin-1, so anything but visible ASCII would never match on the other side.
  if (!/^[\x21-\x7e]+$/.test(token)) {
    throw new EnvError(`${name} must be visible ASCII characters only (no spaces, no accents): it is sent as a header value`)
  }
  return token
}

/** The INTERNAL_TOKEN docker-compose.yml falls back to: published in the repository, so only for a local try. */
export const COMPOSE_DEFAULT_INTERNAL_TOKEN = 'local-only-internal-token-change-me'

/** Says so when INTERNAL_TOKEN is compose's published default: anything on that network could call the pets-service. */
export function warnOfPublishedToken(token: string, logger: Logger): void {
  if (token !== COMPOSE_DEFAULT_INTERNAL_TOKEN) return
  logger.warn('INTERNAL_TOKEN is docker-compose.yml\'s published default: fine for a local try, never for a deployment (set INTERNAL_TOKEN)')
}

/** Default SHUTDOWN_DRAIN_SECONDS: long enough for a load balancer to see /readyz fail and stop routing. */
export const DEFAULT_DRAIN_SECONDS = 5

/**
 * SHUTDOWN_DRAIN_SECONDS (0–60): how long a service keeps serving after SIGTERM, not ready and
 * answering with `Connection: close`, before it closes its listener. A malformed value stops the
 * process at boot.
 */
export function drainMillisFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.SHUTDOWN_DRAIN_SECONDS
  if (raw === undefined || raw === '') return DEFAULT_DRAIN_SECONDS * 1_000
  const seconds = Number(raw)
  if (!/^\d+(\.\d+)?$/.test(raw) || seconds > 60) {
    throw new EnvError(`SHUTDOWN_DRAIN_SECONDS must be a number of seconds from 0 to 60, got "${raw}"`)
  }
  return Math.round(seconds * 1_000)
}

/**
 * GATEWAY_MAX_CONNECTIONS, PETS_MAX_CONNECTIONS (1–1000000): the most client connections a
 * service's public port holds at once; unset, the service derives it from its open-file limit
 * (connectionCap.ts). A malformed value stops the process at boot.
 */
export function maxConnectionsFromEnv(name: string, fallback: number | undefined, env: NodeJS.ProcessEnv = process.env): number | undefined {
  return connectionCountFromEnv(name, MAX_CONNECTIONS_LIMIT, env) ?? fallback
}

/** The highest server.maxConnections (and its environment variables) accept. */
export const MAX_CONNECTIONS_LIMIT = 1_000_000
