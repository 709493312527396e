import { createRequire } from 'node:module'
import calculateSlot from 'cluster-key-slot'
import { Cluster, Command, Redis, type AbstractConnector, type RedisOptions, type Result } from 'ioredis'
import type { LimitDecision, LimitOutcome, LimitRequest, LimitStore, UnbanOptions } from './limitStore.ts'
import { UNBAN_APPLIED_MILLIS, limitKey, unbanAppliedKey } from './limitStore.ts'
import { BAN_MEMORY_MILLIS } from './planLimits.ts'
import { SLIDING_WINDOW_LUA, UNBAN_LUA, UNBAN_PENDING, UNBAN_PENDING_MILLIS, UNBAN_STATE_LUA } from './slidingWindowScript.ts'
import { clusterSeed, clusterUsesTls } from '../config/loadConfig.ts'
import { readTlsPair, type TlsFiles } from '../config/tlsFiles.ts'

export type RedisClient = Redis | Cluster

/**
 * A script on two keys refused while their slot migrates: Redis answers TRYAGAIN unless both are
 * on the node asked, and ioredis, trying again on other nodes, gives up with the last redirect.
 */
function slotMigrating(error: unknown): boolean {
  const message = (error as { message?: string } | undefined)?.message ?? ''
  return /\bTRYAGAIN\b/.test(message) || message.startsWith('Too many Cluster redirections')
}

type ScriptReply = [number, number, number, number, number, number, number, number, number, number]

declare module 'ioredis' {
  interface RedisCommander<Context> {
    slidingWindow(key: string, ...args: (string | number)[]): Result<ScriptReply, Context>
    unbanKey(key: string, appliedKey: string, appliedMillis: number, nowOverrideMillis: number, memoryMillis: number): Result<number, Context>
    unbanState(key: string, unused: number, nowOverrideMillis: number, memoryMillis: number): Result<number, Context>
  }
}

const OUTCOMES: LimitOutcome[] = ['admitted', 'limited', 'banned']
/** The script's outcome when Redis ran it after its deadline: it counted nothing. */
const EXPIRED = 3
/** How often a gateway looks whether another one has finished applying an unban in steps. */
const UNBAN_PENDING_POLL_MILLIS = 20
/** A Cluster key's failure domain before the client knows the slot's master. */
const UNKNOWN_MASTER = 'cluster'
const CLUSTER_SLOTS = 16_384

export interface RedisConnection {
  /** redis://… or rediss://… for one server, or a list of host:port seeds for Redis Cluster (each rediss://host:port for TLS). */
  url?: string
  clusterNodes?: string[]
  /** AUTH for every connection (each Cluster node's); a `url` with its own credentials keeps them. */
  username?: string
  password?: string
  /** The certificate every TLS connection presents (read again at each connection, so a rotated pair is taken up). */
  clientCertificate?: TlsFiles
  /** Key prefix, so tests and several deployments can share a server safely. */
  keyPrefix?: string
  /** Budget for one command; past it the request is answered per onStoreFailure (see withinBudget). */
  commandTimeoutMillis: number
}

export class RedisBudgetExceededError extends Error {
  constructor(budgetMillis: number) {
    super(`Redis did not answer within ${budgetMillis} ms`)
    this.name = 'RedisBudgetExceededError'
  }
}

/** Registers a callback to run once the commands written in this event-loop turn have left. */
export type WhenSent = (callback: () => void) => void

const sendNow: WhenSent = (callback) => callback()

/**
 * Settles like `work`, or rejects with RedisBudgetExceededError once `budgetMillis` have passed
 * without an answer. The budget starts when the command leaves the process (`whenSent`: the writes
 * of a turn are held until its check phase, see coalesceWritesPerTurn), and the timer's verdict
 * waits for the check phase of the event-loop turn in which it fires (setImmediate), after that
 * turn has read the sockets: a reply already waiting there wins. A gateway whose event loop is
 * merely busy (a burst of requests on a small CPU) therefore never mistakes its own lag for a slow
 * Redis, which would hand the decision to the per-process fallback and over-admit. A Redis that
 * really is late still loses at the budget.
 */
export function withinBudget<T>(work: Promise<T>, budgetMillis: number, whenSent: WhenSent = sendNow): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false
    let timer: NodeJS.Timeout | undefined
    whenSent(() => {
      if (settled) return
      timer = setTimeout(() => {
        setImmediate(() => {
          if (settled) return
          settled = true
          reject(new RedisBudgetExceededError(budgetMillis))
        })
      }, budgetMillis)
    })
    work.then(
      (value) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        resolve(value)
      },
      (error: unknown) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        reject(error)
      },
    )
  })
}

/**
 * The client's own command timeout: only a backstop that settles commands a hung server never
 * answers. The per-request budget is withinBudget()'s, because ioredis rejects on its timer
 * without first reading the replies already waiting in the socket.
 */
export function backstopTimeoutMillis(budgetMillis: number): number {
  return Math.max(10 * budgetMillis, 2_000)
}

/** How often a Cluster client reads the slot map when no redirect has made it do so. */
export const SLOTS_REFRESH_MILLIS = 5_000

/**
 * Redis's reply to a write (the rate-limit scripts write) on a replica: at the top on Redis 7, and
 * inside a script's error (`ERR Error running script … -READONLY …`) on Redis 6.
 */
const READ_ONLY_REPLICA = /\bREADONLY You can't write against a read only replica/

/** Each client's last connection error, until it is ready again: why it has no connection (redisConnectionProblem). */
const lastConnectionErrors = new WeakMap<RedisClient, string>()
/** Clients whose last connection error is Redis refusing their credentials (redisRefusesCredentials). */
const credentialRefusals = new WeakSet<RedisClient>()
/**
 * A Cluster's nodes (host:port) that refuse its credentials, with Redis's words, until they
 * accept them. ACLs and requirepass are per node: one node set up apart refuses while the cluster
 * as a whole is ready, and says so only on its own connection ('node error').
 */
const nodeCredentialRefusals = new WeakMap<Cluster, Map<string, string>>()
/**
 * A Cluster's nodes (host:port) whose connection failed, with why, until it is ready again. One
 * dead master leaves the Cluster client ready, and ioredis queues and redirects a call to it
 * until the budget runs out: without this, its failure read "did not answer within 50 ms", as a
 * slow Redis's does, while it refused every connection.
 */
const nodeConnectionErrors = new WeakMap<Cluster, Map<string, string>>()
/**
 * A command connecting needs that the ACL user may not run: SELECT for a database number, which
 * ioredis sends without waiting for it, and then goes on, ready, in database 0.
 */
const connectRefusals = new WeakMap<RedisClient, string>()
/** Who is told when a client's credential refusals change (watchCredentialRefusals). */
const credentialWatchers = new WeakMap<RedisClient, (() => void)[]>()

/**
 * Commands fail fast instead of queueing while Redis is away (no offline queue, no retries):
 * the caller answers within its time budget and the client reconnects in the background. A
 * Cluster's node connections are ioredis's own: they queue a command until connected, and a
 * command to a dead master is retried there until the slot map changes; the budget bounds it all
 * the same (a late reply is not counted: the script's deadline).
 */
export function connectRedis(connection: RedisConnection): RedisClient {
  const options: RedisOptions = {
    commandTimeout: backstopTimeoutMillis(connection.commandTimeoutMillis),
    // commandTimeout settles a command but keeps it queued until its reply, which a frozen server
    // (SIGSTOP, a paused container, a suspended VM) never sends: the queue grew with every request
    // for as long as the freeze lasted. A connection silent this long with commands waiting is
    // dropped instead, with them; the client reconnects, and is not ready until Redis answers.
    socketTimeout: backstopTimeoutMillis(connection.commandTimeoutMillis),
    connectTimeout: 1_000,
    // RESP2, as before ioredis 6, whose default RESP3 opens each connection with HELLO: a login
    // refused for want of a password then read "NOAUTH HELLO must be called with the client
    // already authenticated…" instead of Redis's "NOAUTH Authentication required.", and whatever
    // sits at REDIS_URL (a proxy, a Redis-compatible server) must know HELLO, or answer it in the
    // words ioredis takes for "no RESP3". The gateway uses nothing RESP3 adds.
    protocol: 2,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    keyPrefix: connection.keyPrefix,
    ...(connection.password === undefined ? {} : { username: connection.username, password: connection.password }),
    retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 1_000),
    lazyConnect: false,
  }
  const seeds = connection.clusterNodes?.map((node) => {
    const seed = clusterSeed(node)
    if (!seed) throw new Error(`not a Redis Cluster seed (host:port): "${node}"`)
    return seed
  })
  // ioredis takes TLS for a URL from its scheme alone (the config has made it lower-case). The
  // seeds decide only when there are some: a REDIS_CLUSTER_NODES of blanks and commas leaves REDIS_URL's server.
  const tls = seeds?.length ? clusterUsesTls(connection.clusterNodes!) : connection.url?.startsWith('rediss://') === true
  const handshakes = tls ? handshakeErrors(connection.clientCertificate) : undefined
  const client = seeds?.length
    ? new Cluster(
        seeds,
        {
          // Node's defaults: the certificate is verified against its CAs (and NODE_EXTRA_CA_CERTS)
          // and the name the node is reached by, for every node the slot map names.
          redisOptions: handshakes ? { ...options, tls: {}, Connector: handshakes.Connector } : options,
          // ioredis resolves a seed's host name to an address before connecting, and the certificate
          // was then checked against that address: a certificate that names the host (a managed
          // cluster's configuration endpoint) failed with ERR_TLS_CERT_ALTNAME_INVALID.
          ...(tls ? { dnsLookup: (address: string, callback: (error: null, address: string) => void) => callback(null, address) } : {}),
          keyPrefix: connection.keyPrefix,
          enableOfflineQueue: false,
          // The ready check asks a master found a moment ago, before its connection is up; without
          // an offline queue that fails and the client starts over from the seeds, again and again
          // when REDIS_CLUSTER_NODES names only some masters (up to 10 s of starts on the fallback).
          // Each command is bounded by the budget anyway, and a cluster that is down says so on it.
          enableReadyCheck: false,
          clusterRetryStrategy: (attempt) => Math.min(100 * 2 ** attempt, 1_000),
          // TRYAGAIN comes only to an unban while its key's slot migrates, which then goes on in
          // steps (unbanInSteps): ioredis's 100 ms between its tries held that up for over a second.
          retryDelayOnTryAgain: 10,
          // A cluster that has lost a master's slots answers CLUSTERDOWN, for every slot unless
          // cluster-require-full-coverage is off. ioredis's retries of it outlast the budget, so the
          // request was answered as a timeout that named a healthy master: now the reply itself.
          retryDelayOnClusterDown: 0,
          // The slot map is otherwise read only at a redirect: a gateway with no traffic on a moved
          // slot kept connections to masters that had since failed over and been removed, and lost
          // them all at once with nowhere known to reconnect (reconnectThroughKnownNodes).
          slotsRefreshInterval: SLOTS_REFRESH_MILLIS,
        },
      )
    : new Redis(connection.url ?? 'redis://127.0.0.1:6379', {
        ...options,
        // A managed Redis's primary endpoint is a name that moves to the promoted replica at a
        // failover, and the open connection stays with the old primary, now a replica refusing
        // every script: the gateway answered per onStoreFailure until it was restarted. A new
        // connection goes where the name points now. (A Cluster follows its slot map instead.)
        reconnectOnError: (error) => READ_ONLY_REPLICA.test(error.message),
        ...(handshakes ? { Connector: handshakes.Connector } : {}),
      })
  if (client instanceof Cluster && seeds) {
    reconnectThroughKnownNodes(client, seeds)
    refuseUnreadableSlotMaps()
    refuseRedirectsToNowhere(client)
  }
  // Errors surface on the commands that hit them; the connection-level event is kept for readiness.
  const credentialsChanged = () => credentialWatchers.get(client)?.forEach((watcher) => watcher())
  client.on('error', (error: Error) => {
    // A command tried on the connection just lost: the reason is the error before it.
    if (OFFLINE.test(error.message) && lastConnectionErrors.has(client)) return
    const text = connectionErrorText(error)
    // A single server's error is its socket's own, the reason included.
    lastConnectionErrors.set(client, handshakes && client instanceof Cluster ? handshakes.explain(text) : text)
    if (CREDENTIALS_REFUSED.test(text)) credentialRefusals.add(client)
    else credentialRefusals.delete(client)
    const refused = redisRefusesPermission(error)
    if (refused !== undefined) connectRefusals.set(client, refused)
    credentialsChanged()
  })
  client.on('ready', () => {
    lastConnectionErrors.delete(client)
    handshakes?.clear()
    credentialRefusals.delete(client)
    credentialsChanged()
  })
  if (client instanceof Cluster) {
    const refusing = new Map<string, string>()
    nodeCredentialRefusals.set(client, refusing)
    const unconnected = new Map<string, string>()
    nodeConnectionErrors.set(client, unconnected)
    /** Per node address, the connection ioredis made last: only its errors and end count. */
    const current = new Map<string, Redis>()
    client.on('node error', (error: Error, node: string) => {
      if (CREDENTIALS_REFUSED.test(error.message)) refusing.set(node, error.message)
      else refusing.delete(node)
      credentialsChanged()
    })
    // A node that refuses is dropped at once and added again at the next slot-map refresh, to
    // refuse again: it still refuses until it accepts, or until the slot map no longer names it.
    client.on('+node', (node: Redis) => {
      const name = `${node.options.host}:${node.options.port}`
      // ioredis follows an ASK redirect (a reshard under way) with ASKING and drops its reply: an
      // ACL user without +asking had it refused, unhandled, which ended the process. The command
      // after it then fails like any other (redirected back and forth), per onStoreFailure.
      const asking = node.asking.bind(node)
      node.asking = ((...args: Parameters<typeof asking>) => {
        const sent = asking(...args)
        sent.catch(() => undefined)
        return sent
      }) as typeof node.asking
      // The node's own connection only: 'node error' also carries a slot-map refresh's failure on a
      // separate connection (a node busy for a second: "timeout"), which said a connected node was not.
      // And the connection ioredis uses for the node now: one it replaced (a redirect back to the
      // same node) may end after its successor is ready, and would have marked a live node.
      current.set(name, node)
      node.on('error', (error: Error) => {
        if (current.get(name) !== node) return
        // A command failed on the connection just lost: the reason is the error before it.
        if (!(CLOSED.test(error.message) && unconnected.has(name))) unconnected.set(name, connectionErrorText(error))
      })
      // A server that died closes the connection without an error (its kernel sends FIN), and no
      // new connection is tried before the next call to it: until then, that is the reason.
      node.on('end', () => {
        if (current.get(name) === node && !unconnected.has(name)) unconnected.set(name, 'the server closed the connection')
      })
      node.on('ready', () => {
        unconnected.delete(name)
        if (refusing.delete(name)) credentialsChanged()
      })
    })
    client.on('refresh', () => {
      const named = new Set(client.nodes('all').map((node) => `${node.options.host}:${node.options.port}`))
      let changed = false
      for (const name of refusing.keys()) if (!named.has(name)) changed = refusing.delete(name) || changed
      // A node the slot map no longer names (replaced, or a new address after a restart) is no
      // one's reason. The map, not the pool: a dead master's connection comes and goes with each
      // call, and is named by the map until its replica takes over.
      const mapped = new Set<string>()
      for (const holders of client.slots) for (const holder of holders ?? []) mapped.add(holder)
      for (const name of unconnected.keys()) if (!mapped.has(name)) unconnected.delete(name)
      for (const name of current.keys()) if (!mapped.has(name) && !named.has(name)) current.delete(name)
      if (changed) credentialsChanged()
    })
  }
  // defineCommand sends EVALSHA and falls back to EVAL on NOSCRIPT (after a restart or failover).
  client.defineCommand('slidingWindow', { numberOfKeys: 1, lua: SLIDING_WINDOW_LUA })
  client.defineCommand('unbanKey', { numberOfKeys: 2, lua: UNBAN_LUA })
  client.defineCommand('unbanState', { numberOfKeys: 1, lua: UNBAN_STATE_LUA })
  return client
}

/**
 * ioredis starts over from its startup nodes whenever it has lost every node connection at once
 * (a network blip, every master restarted): from REDIS_CLUSTER_NODES alone. Nodes are replaced
 * over a cluster's life (new nodes added, the old ones failed over and removed), so once none of
 * the seeds is left the gateway never found the cluster again: every request on the fallback, or
 * 503, until it was restarted with new seeds. Each refresh of the slot map therefore makes the
 * nodes it names the startup nodes, the configured seeds after them.
 */
function reconnectThroughKnownNodes(client: Cluster, seeds: { host: string; port: number }[]): void {
  // startupNodes is ioredis's own list (private in its types), read on every (re)connect.
  const cluster = client as unknown as { startupNodes: { host: string; port: number }[] }
  client.on('refresh', () => {
    const known = client.nodes('all').map((node) => ({ host: String(node.options.host), port: Number(node.options.port) }))
    const key = (node: { host: string; port: number }) => `${node.host}:${node.port}`
    const names = new Set(known.map(key))
    cluster.startupNodes = [...known, ...seeds.filter((seed) => !names.has(key(seed)))]
  })
}

/**
 * ioredis reads a CLUSTER SLOTS reply in a callback that indexes into it unchecked: a nil where
 * the map, a slot range or a range's node should be (from a broken or hostile node, or forged on a
 * cleartext connection) threw a TypeError that ioredis re-throws outside any handler, and the
 * gateway process died, at start or at any later refresh (and ranges past the 16,384 slots, see
 * slotsCounted, ended it out of memory). Such a reply now fails the command
 * instead, as a node that cannot answer does: ioredis asks the next node and, failing all, retries
 * (meanwhile requests are decided per onStoreFailure). The transformer is ioredis's own hook and
 * global to the process; the one other CLUSTER reply ioredis reads (INFO, a string) passes as is.
 */
function refuseUnreadableSlotMaps(): void {
  Command.setReplyTransformer('cluster', (reply: unknown) => {
    const missing = (value: unknown) => value === null || value === undefined
    const unreadable =
      missing(reply) || (Array.isArray(reply) && (reply.some((range) => missing(range) || (Array.isArray(range) && range.slice(2).some(missing))) || slotsCounted(reply) > CLUSTER_SLOTS))
    if (unreadable) throw new Error('a CLUSTER SLOTS reply that is no slot map (a nil where a slot range or node should be, or ranges beyond the 16,384 slots)')
    return reply
  })
}

/**
 * How many slots ioredis would fill from a reply's ranges: it counts from each range's first item
 * to its second with `<=` and `++`. A real map names each slot once, 16,384 at most; a range ending
 * at 4,000,000,000 (a number or a string) grew ioredis's slot table until V8 stopped the process, a
 * fatal error no handler catches, and many full ranges would hold the event loop for minutes.
 * Items that are no number (CLUSTER SHARDS's and LINKS's field names) count once at most: nothing.
 */
function slotsCounted(reply: unknown[]): number {
  let total = 0
  for (const range of reply) {
    const span = Array.isArray(range) ? Number(range[1]) - Number(range[0]) + 1 : 0
    if (span > 0) total += span
  }
  return total
}

/**
 * A MOVED or ASK that names no node (`MOVED 5`, `ASK`) made ioredis map `undefined` to a node
 * address, a TypeError thrown from the socket's data handler: the gateway process died. Only a
 * broken or hostile node, or a forged reply, says that; the command now fails with the node's
 * words instead, as any error reply does (the request goes per onStoreFailure).
 */
function refuseRedirectsToNowhere(client: Cluster): void {
  // handleError is ioredis's own method (private in its types), which every error reply passes.
  const cluster = client as unknown as { handleError(error: Error, ttl: unknown, handlers: { defaults(): void }): void }
  const handleError = cluster.handleError.bind(client)
  cluster.handleError = (error, ttl, handlers) => {
    const [kind, , node] = error.message.split(' ')
    if ((kind === 'MOVED' || kind === 'ASK') && !/^\S*:\d+$/.test(node ?? '')) return handlers.defaults()
    handleError(error, ttl, handlers)
  }
}

type ConnectorClass = new (options: unknown) => AbstractConnector & {
  connect(...args: Parameters<AbstractConnector['connect']>): ReturnType<AbstractConnector['connect']>
}

/**
 * ioredis's own connector (not exported from its index; the `Connector` option that takes a
 * replacement is). Loaded for TLS connections only, so a gateway without TLS to Redis never
 * depends on where ioredis keeps the file.
 */
function standaloneConnector(): ConnectorClass {
  return (createRequire(import.meta.url)('ioredis/built/connectors/StandaloneConnector.js') as { default: ConnectorClass }).default
}

/**
 * Two defects of ioredis over TLS, on every connection it makes (a single server's; a Cluster's to
 * each node, and the one it reads the slot map on):
 * - It listens for a single 'error' on each socket. A refused handshake (a CA this process does
 *   not trust) may bring the server's alert after it as a second one, and that second error,
 *   unheard, ended the process: 6 of 30 runs of a Cluster client left to retry for 3 s with the
 *   wrong CA. A connection closed while its handshake is under way (the gateway's shutdown, a
 *   Cluster's slot-map connection when done) brings it most often: a `rediss://` REDIS_URL crashed
 *   too, in every run of 200 clients closed a few milliseconds after they were made.
 * - A Cluster that cannot read its slot map said only "Failed to refresh slots cache. Connection is
 *   closed.": the connection it reads it on drops its error.
 * Every socket therefore keeps a listener of its own; the latest socket's first error is the
 * reason `explain` appends to the client's errors, until the client is ready again.
 */
function handshakeErrors(clientCertificate: TlsFiles | undefined): { Connector: NonNullable<RedisOptions['Connector']>; explain(text: string): string; clear(): void } {
  let last: { message: string; fromTls: boolean } | undefined
  let pair: { cert: Buffer; key: Buffer } | undefined
  class Connector extends standaloneConnector() {
    async connect(...args: Parameters<AbstractConnector['connect']>) {
      if (clientCertificate) {
        // The files were checked at start; a pair that cannot be read now (a rotation half done)
        // leaves the last good one in use: a connector that fails ends ioredis's client for good.
        try {
          const { cert, key } = readTlsPair(clientCertificate)
          pair = { cert, key }
        } catch {
          // The pair read before stays.
        }
        const options = (this as unknown as { options: { tls?: object | boolean } }).options
        options.tls = { ...(typeof options.tls === 'object' ? options.tls : {}), ...pair }
      }
      const stream = await super.connect(...args)
      // The first error is the reason; the ones after it (ECONNRESET, the server's alert) follow from it.
      let first = true
      stream.on('error', (error: Error & { syscall?: string }) => {
        // A socket's own failure (connect ECONNREFUSED: a node down) is no TLS problem, and not named one.
        if (first) last = { message: error.message, fromTls: error.syscall === undefined }
        first = false
      })
      return stream
    }
  }
  return {
    Connector,
    explain: (text) => (last === undefined || text.includes(last.message) ? text : `${text} (${last.fromTls ? 'TLS: ' : ''}${last.message})`),
    clear: () => {
      last = undefined
    },
  }
}

/** ioredis's words for a command on a connection it does not have (the offline queue is off). */
const OFFLINE = /Stream isn't writeable and enableOfflineQueue options is false/
/** ioredis's words for a command on a connection that has just closed. */
const CLOSED = /^Connection is closed\.$/
/** ioredis's words for a connection on which the server sent nothing within connectTimeout ("… in NaNms"). */
const SILENT = /^Socket timeout\. Expecting data, but didn't receive any/

/**
 * A connection error as readiness reports it. A Cluster that cannot read its slot map says only
 * "Failed to refresh slots cache."; the last node's own error says why (WRONGPASS, NOAUTH,
 * ECONNREFUSED), as a single server's error does. ioredis's own words for a silent server, and
 * for a command tried with no connection, are said plainly.
 */
function connectionErrorText(error: Error): string {
  const cause = (error as Error & { lastNodeError?: unknown }).lastNodeError
  const text = cause instanceof Error && cause.message ? `${error.message} ${cause.message}` : error.message
  if (SILENT.test(text)) return 'the server took the connection but sent no answer (frozen, overloaded, or not Redis)'
  if (OFFLINE.test(text)) return 'no connection yet'
  return text
}

const coalescers = new WeakMap<RedisClient, (send: () => void) => WhenSent>()

/**
 * Sends a client's commands of one event-loop turn together at its check phase, so the commands
 * of all the requests that arrived together leave in one write (one syscall here, one read in
 * Redis) instead of one each. Hand it a function that sends the command; it is run then, with the
 * turn's others, on corked connections, and the answer is a WhenSent for that write (the time
 * budget starts there). Sent at the write, not when asked: what a command says about time (a
 * script's deadline) is reckoned from the moment it leaves, whatever was left of the turn after
 * the request asked for it. One coalescer per client, shared by everything that sends through it
 * (budgetedSender).
 */
function coalesceWritesPerTurn(client: RedisClient): (send: () => void) => WhenSent {
  let coalesce = coalescers.get(client)
  if (coalesce !== undefined) return coalesce
  let pending: (() => void)[] | undefined
  let sent: (() => void)[] = []
  const whenSent: WhenSent = (callback) => {
    sent.push(callback)
  }
  // A Cluster routes each command to its slot's master, known only inside ioredis: hold them all.
  const connections = () => (client instanceof Redis ? [client] : client.nodes('master'))
  const flush = () => {
    const sends = pending ?? []
    pending = undefined
    const corked: Redis['stream'][] = []
    // Outside any request now: a failure here would be the process's, so the sends go out uncorked instead.
    try {
      for (const connection of connections()) {
        if (connection.status !== 'ready') continue
        connection.stream.cork()
        corked.push(connection.stream)
      }
    } catch {
      // one write per command this turn
    }
    for (const send of sends) send()
    for (const stream of corked) stream.uncork()
    const callbacks = sent
    sent = []
    for (const callback of callbacks) callback()
  }
  coalesce = (send) => {
    if (pending === undefined) {
      pending = []
      setImmediate(flush)
    }
    pending.push(send)
    return whenSent
  }
  coalescers.set(client, coalesce)
  return coalesce
}

/**
 * How every rate-limit command goes to Redis: in its turn's coalesced write, and bounded by the
 * time budget (when there is one) from the moment that write leaves the process.
 */
export function budgetedSender(client: RedisClient, budgetMillis: number | undefined): <T>(send: () => Promise<T>) => Promise<T> {
  const coalesce = coalesceWritesPerTurn(client)
  return <T>(send: () => Promise<T>) => {
    let whenSent: WhenSent = sendNow
    const work = new Promise<T>((resolve, reject) => {
      whenSent = coalesce(() => {
        try {
          send().then(resolve, reject)
        } catch (error) {
          reject(error)
        }
      })
    })
    return budgetMillis === undefined ? work : withinBudget(work, budgetMillis, whenSent)
  }
}

/**
 * How late (after the command left) a script may start and still count, with twice the budget if
 * that is longer; see redisClockFor. It was 1 s: a stall shorter than that (a Redis paused for
 * half a second) let every command it held count once Redis resumed, after the gateway had
 * answered those requests without Redis; under onStoreFailure closed a burst of 503s spent the
 * key's quota and banned it.
 */
export const LATE_AFTER_MILLIS = 100

/**
 * A deadline, in Redis's clock, for each script call: a call Redis runs later than that (it was
 * stalled, busy or paused while the command waited in its socket) counts nothing, because the
 * gateway has long answered that request per onStoreFailure, and counting it afterwards would
 * spend the key's quota, or strike and ban it, for requests it was never charged for.
 *
 * Redis's clock is learnt from the replies, per failure domain (a Cluster master has its own):
 * each reply's TIME minus the moment (monotonic, immune to steps of this host's clock) the call
 * was made bounds the clock offset from above, and the smallest such bound is kept. The deadline
 * is that estimate of Redis's "now" as the command leaves (the call is made at the end of the
 * turn that asked for it, see budgetedSender) plus LATE_AFTER_MILLIS (or twice the budget if
 * longer): the budget, and as much again for the way there and the estimate's error, so that a
 * healthy Redis does not see calls expire (each would cost a second round trip), however long the
 * gateway's turns, while a stall of more than that costs the key nothing for the requests it
 * held. A reply that comes back expired within the budget says the estimate was wrong (this
 * host's lag, or Redis's clock stepped forward): the reply's time corrects it, and the call is
 * made once more with a fresh deadline. Until a domain has answered once, its calls carry none.
 */
export function redisClockFor(budgetMillis: number | undefined) {
  const offsets = new Map<string, number>()
  const lateAfterMillis = budgetMillis === undefined ? 0 : Math.max(LATE_AFTER_MILLIS, 2 * budgetMillis)
  return {
    deadline(domain: string, calledAt: number): number {
      const offset = offsets.get(domain)
      return budgetMillis === undefined || offset === undefined ? 0 : Math.ceil(calledAt + offset + lateAfterMillis)
    },
    learn(domain: string, calledAt: number, redisNow: number, expired: boolean): void {
      const bound = redisNow - calledAt
      const known = offsets.get(domain)
      if (known === undefined || bound < known || expired) offsets.set(domain, bound)
    },
  }
}

export class RedisDeadlineError extends Error {
  constructor() {
    super('Redis ran the rate-limit script after its deadline twice')
    this.name = 'RedisDeadlineError'
  }
}

function decisionOf(request: LimitRequest, reply: ScriptReply): LimitDecision {
  const [outcome, now, minuteRemaining, minuteReset, dayRemaining, dayReset, retryAfter, banStep, newBan, banLeft] = reply
  return {
    outcome: OUTCOMES[outcome] ?? 'limited',
    nowMillis: now,
    minute: { limit: request.minute.limit, remaining: minuteRemaining, resetMillis: minuteReset },
    day: { limit: request.day.limit, remaining: dayRemaining, resetMillis: dayReset },
    retryAfterMillis: retryAfter,
    banMillisLeft: banLeft,
    banStep,
    newBan: newBan === 1,
  }
}

/**
 * A script call past the budget is answered per onStoreFailure, but Redis may still run it
 * within its deadline (LATE_AFTER_MILLIS): it then counted the request, and may have struck and
 * banned the key. Its reply, when it comes, goes to the request's onLateDecision.
 */
function reportLate(request: LimitRequest, sent: Promise<ScriptReply> | undefined, calledAt: number): void {
  sent?.then(
    (reply) => {
      if (reply[0] !== EXPIRED) request.onLateDecision?.(request, decisionOf(request, reply), calledAt)
    },
    () => {},
  )
}

/** The failure domain holding `key` (its Cluster master as of the client's slot map, or `redis`). */
export function redisFailureDomain(client: RedisClient, key: string): string {
  return client instanceof Cluster ? (client.slots[calculateSlot((client.options.keyPrefix ?? '') + key)]?.[0] ?? UNKNOWN_MASTER) : 'redis'
}

export function createRedisStore(client: RedisClient, options: { budgetMillis?: number } = {}): LimitStore {
  const send = budgetedSender(client, options.budgetMillis)
  const sendInTurn = budgetedSender(client, undefined)
  const clock = redisClockFor(options.budgetMillis)
  const failureDomain = (key: string): string => redisFailureDomain(client, key)
  // The failure domains holding keys as of the client's last refresh of the slot map (at each
  // MOVED and every few seconds): the masters serving slots (a dead master stays among them until
  // its replica is promoted), and UNKNOWN_MASTER while a slot has none (unassigned, with
  // cluster-require-full-coverage no). Empty until the map is first read.
  let holdingKeys = new Set<string>()
  if (client instanceof Cluster) {
    client.on('refresh', () => {
      const domains = new Set<string>()
      for (let slot = 0; slot < CLUSTER_SLOTS; slot++) domains.add(client.slots[slot]?.[0] ?? UNKNOWN_MASTER)
      holdingKeys = domains
    })
  }
  async function call(request: LimitRequest, key: string, domain: string): Promise<ScriptReply> {
    const { minute, day, bans } = request
    // No deadline where the master is not known yet, nor in tests that fix the store's time.
    const timed = request.nowMillis === undefined && domain !== UNKNOWN_MASTER
    // Reckoned when the command is sent, at the end of the turn that asked for it (budgetedSender):
    // a long turn does not eat into the deadline.
    let sentAt = 0
    let sent: Promise<ScriptReply> | undefined
    const budgeted = send(() => {
      sentAt = performance.now()
      const deadline = timed ? clock.deadline(domain, sentAt) : 0
      return (sent = client.slidingWindow(
        key,
        request.nowMillis ?? 0,
        minute.limit,
        minute.windowMillis,
        minute.bucketMillis,
        day.limit,
        day.windowMillis,
        day.bucketMillis,
        bans.strikes,
        bans.memoryMillis,
        bans.ladderMillis.join(','),
        deadline,
      ))
    })
    let reply: ScriptReply
    try {
      reply = await budgeted
    } catch (error) {
      if (error instanceof RedisBudgetExceededError && request.onLateDecision) reportLate(request, sent, sentAt)
      throw error
    }
    // A reply from another master than the one the call was meant for (a MOVED or ASK redirect
    // during a reshard or failover) tells nothing about that master's clock.
    if (timed && failureDomain(key) === domain) {
      clock.learn(domain, sentAt, reply[1], reply[0] === EXPIRED)
    }
    return reply
  }

  /**
   * An unban while its key's slot migrates between Cluster masters, where the script on the state
   * and the mark is refused (TRYAGAIN) for as long as the migration lasts (an operator's by hand,
   * minutes): the mark first, as pending, so no other gateway lifts the ban as well; then the lift,
   * on the state alone; then the mark says applied. Another gateway applying the same unban
   * meanwhile waits for the mark to say applied (false), as it would wait for the script, so it
   * forgets the ban it may have cached meanwhile only once the ban is lifted. A gateway that fails
   * between the steps leaves the pending mark to expire (UNBAN_PENDING_MILLIS), and the unban to
   * whichever gateway tries next.
   */
  async function unbanInSteps(key: string, mark: string, now: number, memory: number): Promise<boolean> {
    const givenUpAt = performance.now() + UNBAN_PENDING_MILLIS
    for (;;) {
      if ((await client.set(mark, UNBAN_PENDING, 'PX', UNBAN_PENDING_MILLIS, 'NX')) !== null) {
        await client.unbanState(key, 0, now, memory)
        await client.set(mark, '1', 'PX', UNBAN_APPLIED_MILLIS)
        return true
      }
      const value = await client.get(mark)
      if (value !== null && value !== UNBAN_PENDING) return false
      if (performance.now() > givenUpAt) throw new Error('unban not applied: another gateway has been applying it for longer than it takes')
      await new Promise((resolve) => setTimeout(resolve, UNBAN_PENDING_POLL_MILLIS))
    }
  }

  return {
    kind: 'redis',
    failureDomain: (keyId) => failureDomain(limitKey(keyId)),
    // Unknown until the first refresh: no domain is declared gone before the map is read.
    holdsKeys: (domain) => holdingKeys.size === 0 || holdingKeys.has(domain),
    async consume(request: LimitRequest): Promise<LimitDecision> {
      const key = limitKey(request.keyId)
      const domain = failureDomain(key)
      let reply = await call(request, key, domain)
      if (reply[0] === EXPIRED) reply = await call(request, key, domain)
      if (reply[0] === EXPIRED) throw new RedisDeadlineError()
      return decisionOf(request, reply)
    },
    async unban(keyId: string, changeId: number, options: UnbanOptions = {}) {
      const key = limitKey(keyId)
      const mark = unbanAppliedKey(keyId, changeId)
      const now = options.nowMillis ?? 0
      const memory = options.memoryMillis ?? BAN_MEMORY_MILLIS
      let applied: number
      try {
        // In the turn's write, behind the decisions asked for before it, as they were asked:
        // a decision on its way before the unban is run before it (banCache.int).
        applied = await sendInTurn(() => client.unbanKey(key, mark, UNBAN_APPLIED_MILLIS, now, memory))
      } catch (error) {
        if (!(client instanceof Cluster) || !slotMigrating(error)) throw error
        return unbanInSteps(key, mark, now, memory)
      }
      // Another gateway is applying it in steps: its outcome, once known.
      if (applied === -2) return unbanInSteps(key, mark, now, memory)
      return applied !== -1
    },
    async close() {
      client.disconnect()
    },
  }
}


/**
 * Redis's replies to a login it refuses: a wrong password or ACL user (WRONGPASS; `ERR invalid
 * password` before Redis 6), or none given where one is required (NOAUTH, on ioredis's ready
 * check). A Cluster says them after "Failed to refresh slots cache." (connectionErrorText).
 */
const CREDENTIALS_REFUSED = /\b(?:WRONGPASS|NOAUTH)\b|\bERR invalid password\b/

/**
 * Redis's words when the client has no connection because Redis refuses its credentials;
 * undefined when it is connected or lacks one for another reason (refused, unreachable, frozen).
 */
export function redisRefusesCredentials(client: RedisClient): string | undefined {
  if (client.status !== 'ready' && credentialRefusals.has(client)) return lastConnectionErrors.get(client)
  const nodes = client instanceof Cluster ? nodeCredentialRefusals.get(client) : undefined
  return nodes?.size ? [...nodes].map(([node, words]) => `${node}: ${words}`).join('; ') : undefined
}

/**
 * Redis's replies when the gateway's ACL user may log in but not run a command or touch a key it
 * needs: at the top (`NOPERM …`, EVALSHA itself or the script's keys) or inside a script (Redis
 * 7.0: `ERR The user executing the script can't …`; 7.2: `… ACL failure in script: …`).
 */
const PERMISSION_REFUSED = /\bNOPERM\b|\bThe user executing the script can't\b|\bACL failure in script\b/

/** Redis's words (the first line) when `error` is its ACL refusing a command or key; undefined for any other failure. */
export function redisRefusesPermission(error: unknown): string | undefined {
  const message = error instanceof Error ? error.message : undefined
  return message !== undefined && PERMISSION_REFUSED.test(message) ? message.split('\n')[0]!.slice(0, 200) : undefined
}

/** Redis's words when it refused a command of the client's connecting (SELECT); undefined otherwise. */
export function redisRefusedOnConnect(client: RedisClient): string | undefined {
  return connectRefusals.get(client)
}

/**
 * A name for each failure domain (a Cluster master, or `redis`): `names(0)`, `names(1)`, … until
 * every master holds the key `keyOf` makes of one, as the client's slot map says. On a Cluster,
 * ACLs are per node: a check through one key reaches one master only.
 */
export function oneNamePerMaster(client: RedisClient, names: (n: number) => string, keyOf: (name: string) => string): Map<string, string> {
  if (!(client instanceof Cluster)) return new Map([['redis', names(0)]])
  const keyPrefix = client.options.keyPrefix ?? ''
  const masters = new Set(client.slots.flatMap((owners) => (owners?.[0] === undefined ? [] : [owners[0]])))
  const found = new Map<string, string>()
  for (let n = 0; found.size < masters.size && n < 100 * CLUSTER_SLOTS; n++) {
    const name = names(n)
    const master = client.slots[calculateSlot(keyPrefix + keyOf(name))]?.[0]
    if (master !== undefined && !found.has(master)) found.set(master, name)
  }
  return found
}

/** Calls `changed` whenever what redisRefusesCredentials says may have changed. */
export function watchCredentialRefusals(client: RedisClient, changed: () => void): void {
  credentialWatchers.set(client, [...(credentialWatchers.get(client) ?? []), changed])
}

/**
 * A Cluster's client is ready once one node has given it the slot map, and connects to the other
 * masters only when a command needs one: a master that refuses the credentials would be found by
 * the first requests for its keys. Logs in to every master now, and resolves once each has
 * accepted or refused (redisRefusesCredentials), or after `timeoutMillis`. A single server: at once.
 */
export async function clusterMastersLoggedIn(client: RedisClient, timeoutMillis: number): Promise<void> {
  if (!(client instanceof Cluster)) return
  const outcomes = client.nodes('master').map(
    (node) =>
      new Promise<void>((resolve) => {
        if (node.status === 'ready') return resolve()
        const settled = () => {
          node.off('ready', settled)
          node.off('error', settled)
          resolve()
        }
        node.on('ready', settled)
        node.on('error', settled)
        if (node.status === 'wait') node.connect().catch(() => undefined)
      }),
  )
  let timer: NodeJS.Timeout | undefined
  await Promise.race([Promise.all(outcomes), new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMillis)))])
  clearTimeout(timer)
}

/**
 * Why the client has no usable connection, in ioredis's and the socket's words; on a Cluster that
 * is ready, why it has none to the node `domain` names (a dead master), if that is so.
 */
export function redisConnectionProblem(client: RedisClient, domain?: string): string | undefined {
  if (client.status === 'ready') {
    const nodeError = domain === undefined || !(client instanceof Cluster) ? undefined : nodeConnectionErrors.get(client)?.get(domain)
    return nodeError === undefined ? undefined : `Redis Cluster node ${domain} is not connected: ${nodeError}`
  }
  const error = lastConnectionErrors.get(client)
  return `Redis is not connected (${client.status})${error ? `: ${error}` : ''}`
}

/** Resolves once the client can take commands; false if it could not within the timeout. */
export async function redisReady(client: RedisClient, timeoutMillis = 5_000): Promise<boolean> {
  if (client.status === 'ready') return true
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      client.off('ready', onReady)
      resolve(false)
    }, timeoutMillis)
    const onReady = () => {
      clearTimeout(timer)
      resolve(true)
    }
    client.once('ready', onReady)
  })
}
