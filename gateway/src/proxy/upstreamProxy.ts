import { Readable } from 'node:stream'
import httpProxy from '@fastify/http-proxy'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { Pool, util as undiciUtil, type Dispatcher } from 'undici'
import { onConnectionClose } from '../../../common/src/http/connectionClose.ts'
import { hasNoMediaType, sendApiError } from '../../../common/src/http/errorHandler.ts'
import { spreadAnswers, type RetryAfterSpread } from '../../../common/src/http/retryAfter.ts'
import { CLOSE_DEPENDENCY_MILLIS, SHUTDOWN_DEADLINE_AFTER_DRAIN_MILLIS } from '../../../common/src/lifecycle/shutdown.ts'
import type { UpstreamConfig } from '../config/loadConfig.ts'
import { gatewayErrors } from '../errors.ts'
import { ANSWER_DROPPED, HOP_BY_HOP_SET, VIA, connectionHeaderNames, gatewayHeaders, isClientDropped, sanitizeHeaderValue, spellsDropped } from './headerHygiene.ts'
import {
  UpstreamDeadlineError,
  UpstreamSilentError,
  failureKind,
  isErrorBody,
  isJson,
  upstreamFailure,
  type UpstreamFailureKind,
} from './upstreamFailure.ts'
import { upstreamPathname } from './upstreamPath.ts'
import { acceptOpaqueBodies } from './opaqueBodies.ts'

export interface UpstreamOptions {
  /** The upstream's name in config (upstreams.<name>): its metrics label and the name in its 503. */
  name: string
  /** e.g. http://127.0.0.1:3001 */
  url: string
  timeoutMillis: number
  /** Requests handed to the upstream and not yet ended (answered, failed or given up) beyond which another is refused at once. */
  maxInFlight: number
  /** The credential this upstream checks, and the variable that sets it (named when the upstream refuses it). */
  internalToken: string
  internalTokenVariable: string
  /** Public path served, e.g. /v1/pets, and the upstream path it maps to, e.g. /pets. */
  publicPath: string
  upstreamPath: string
  observer?: UpstreamObserver
  /**
   * The upstream creates nothing twice for a POST sent again with the same Idempotency-Key (the
   * pets-service): such a POST whose connection closed without an answer, or was answered 408, is
   * sent once more. Unset, a POST is never sent twice, key or not: another upstream (orders) may
   * not honour keys.
   */
  honoursIdempotencyKeys?: boolean
}

/** Upstream latency (request sent → response headers) and failures, for the metrics. */
export interface UpstreamObserver {
  response(upstream: string, status: number, seconds: number): void
  failure(upstream: string, kind: UpstreamFailureKind): void
  /** A request sent again (mayResend): its connection closed without an answer, or the upstream answered 408. */
  resent?(upstream: string): void
  /** Once per upstream, at start: its requests outstanding (read at scrape time) and their bound, maxInFlight. */
  inFlight?(upstream: string, outstanding: () => number, limit: number): void
}

/**
 * reply-from's undici defaults (lib/request.js getUndiciOptions), which applied before: 128
 * connections, no pipelining. Not its third, TLS certificates not verified: every request to an
 * https:// upstream carries INTERNAL_TOKEN, which a machine answering for the upstream's address
 * with any certificate at all was handed. An https:// upstream's certificate is verified as the
 * readiness probe's is (Node's CAs and NODE_EXTRA_CA_CERTS), and the request is not sent without.
 */
const UNDICI_DEFAULTS = { connections: 128, pipelining: 1 }

/** Connections the gateway opens to one upstream at most. */
export const UPSTREAM_CONNECTIONS = UNDICI_DEFAULTS.connections

/** Answers up to this size are read whole and sent as one Buffer; larger or unsized ones stream. */
export const BUFFERED_ANSWER_MAX_BYTES = 1_048_576

/**
 * The part of maxInFlight kept from any one API key: a quarter (256 of the default 1,024). A
 * client pipelining on a few connections (128 requests each) took every place, and every other
 * key's requests were refused 503 while it lasted; now it is refused past three quarters, and the
 * other keys' requests go on being sent.
 */
const KEPT_FOR_OTHER_CALLERS = 1 / 4

/** The Retry-After of the 503 past maxInFlight, drawn on each answer: a retry within seconds, not all in the same one. */
const RETRY_AFTER_SATURATED: RetryAfterSpread = { min: 1, max: 3 }

/**
 * What closing may take after the drain: a request let in at its end may wait `timeoutSeconds` for
 * its answer's headers and as long again for its body, then the pools close (each bounded). Under
 * the services' fixed 15 s, a gateway given the shipped 10 s had its answer cut off unsent, no
 * access line, exit 1, while the upstream was still within its bounds.
 */
export function shutdownAfterDrainMillis(upstreams: Record<string, UpstreamConfig | undefined>): number {
  let slowest = 0
  for (const upstream of Object.values(upstreams)) if (upstream) slowest = Math.max(slowest, 2 * upstream.timeoutMillis)
  return Math.max(SHUTDOWN_DEADLINE_AFTER_DRAIN_MILLIS, slowest + CLOSING_STEPS_MILLIS)
}

/**
 * An upstream failure as its line says it: what and why, not where. Its stack is the HTTP
 * client's own frames, the same for every request an outage fails, about 1 KB of each line
 * written at the request rate: the copy keeps the first line. Still an Error of its kind, so the
 * logger serializes it as every other (its `data`, the peer's bytes, not logged).
 */
export function withoutFrames(error: unknown): unknown {
  if (!(error instanceof Error)) return error
  const copy = Object.assign(Object.create(Object.getPrototypeOf(error) as object) as Error, error)
  Object.defineProperty(copy, 'message', { value: error.message, enumerable: false, writable: true })
  Object.defineProperty(copy, 'stack', { value: `${error.name}: ${error.message}`, enumerable: false, writable: true })
  if (error.cause !== undefined) Object.defineProperty(copy, 'cause', { value: withoutFrames(error.cause), enumerable: false, writable: true })
  // Each address tried (a host with an IPv6 and an IPv4 address), which the logger lists.
  if (error instanceof AggregateError) Object.defineProperty(copy, 'errors', { value: error.errors.map(withoutFrames), enumerable: false, writable: true })
  return copy
}

/** The closes after the requests: the key change feed, unbans, the rate-limit store, the pool (1 s each at most), the ops port. */
const CLOSING_STEPS_MILLIS = 5 * CLOSE_DEPENDENCY_MILLIS

/**
 * Stage 4: a public prefix (`/v1/pets` and below) to its upstream. Bodies are read (at most
 * 1 MiB, else 413 before the upstream is contacted) and forwarded as they came; answers, the
 * upstream's Error bodies included, pass through unchanged. An error answer that is not the
 * Error body (an upstream's stack trace or HTML page) is replaced by 502 bad_gateway.
 *
 * `@fastify/http-proxy` owns the routes, the prefix rewrite and the destination checks; its
 * handler hands the checked destination to ours, which talks to the upstream through one undici
 * Pool with a bare dispatch handler. That does what @fastify/reply-from did for these requests
 * (same headers in the same order, same undici options, same answer headers), without its
 * per-request work: header object copied three times, a URL built and cached per path, retry
 * closures, an AsyncResource, and the answer piped through two streams. A sized answer of up
 * to 1 MiB with a Content-Type (every pets-service answer) is collected and sent as one Buffer;
 * anything else streams as before.
 */
export async function upstreamProxy(app: FastifyInstance, options: UpstreamOptions): Promise<void> {
  acceptOpaqueBodies(app)
  const name = options.name
  const origin = new URL(options.url)
  const base = options.url
  const baseHref = origin.href
  const host = origin.host
  const pool = new Pool(origin.origin, {
    ...UNDICI_DEFAULTS,
    keepAliveTimeout: 60_000,
    headersTimeout: options.timeoutMillis,
    bodyTimeout: options.timeoutMillis,
    // undici's default is 10 s whatever the upstream timeout. An upstream whose accept queue is
    // full (frozen, or too slow to accept) leaves connects unanswered, and requests wait for a
    // connection behind them: each connect gets no longer than a whole request.
    connectTimeout: options.timeoutMillis,
  })
  app.addHook('onClose', async () => {
    await pool.close()
  })

  // Upstream latency: request handed to the upstream → its response headers back, under the
  // upstream's status (answerHead gave it to the reply). An answer the gateway refused to pass on
  // (fail), or one the upstream broke off, is counted as a failure only; one the client left
  // before its end, when it leaves (answered), as no onResponse follows.
  const waited = new WeakMap<object, number>()
  const observer = options.observer
  if (observer) {
    app.addHook('onResponse', (request, reply, done) => {
      answered(request, reply.statusCode)
      done()
    })
  }
  function answered(request: FastifyRequest, status: number): void {
    const seconds = waited.get(request)
    if (seconds === undefined) return
    waited.delete(request)
    observer?.response(name, status, seconds)
  }

  /**
   * A client's Content-Type that is no media type at all (`bogus`, `a, b`), set aside while the
   * body is read. Fastify refuses such a type with 415 as it starts to read a body, before any
   * route; below this prefix the upstream owns the paths and methods, and a method a path lacks is
   * its 405 whatever the body (an operation that reads the body refuses the type itself, 415). So
   * the body is read as bytes like any other, and the header goes on as the client sent it. Not a
   * QUERY's: without its Content-Type, Fastify would refuse it with 400 as it does a QUERY that sent none.
   */
  const unparsedContentType = new WeakMap<FastifyRequest, string>()
  app.addHook('preParsing', (request, _reply, payload, done) => {
    if (request.method !== 'QUERY' && hasNoMediaType(request)) {
      unparsedContentType.set(request, request.headers['content-type'] as string)
      delete request.headers['content-type']
    }
    done(null, payload)
  })

  /**
   * Requests dispatched to the pool whose exchange undici has not ended yet. A request answered
   * 504 at its deadline stays among them until undici lets go of it, and with a hung upstream
   * that is a connect timeout later for each of the pool's connections in turn: without a bound,
   * every client request would add its request, reply and handler (about 7 KB) to undici's queue
   * for as long as the upstream stays hung. Past the bound the gateway answers 503 at once.
   */
  const link: UpstreamLink = {
    name,
    timeoutMillis: options.timeoutMillis,
    observer,
    waited,
    inFlight: 0,
    running: new Map(),
    waiting: new Map(),
    connectionShare: UPSTREAM_CONNECTIONS - Math.floor(UPSTREAM_CONNECTIONS * KEPT_FOR_OTHER_CALLERS),
    honoursIdempotencyKeys: options.honoursIdempotencyKeys === true,
    fail,
    answered,
    answerHead,
    pool,
  }
  observer?.inFlight?.(name, () => link.inFlight, options.maxInFlight)
  /** A 503 with `message`, its Retry-After drawn for each answer from 1 to 3 s. */
  const unsent = (message: string) =>
    spreadAnswers(RETRY_AFTER_SATURATED, (retryAfter) => gatewayErrors.create('service_unavailable', message, { headers: { 'retry-after': retryAfter } }))
  const saturated = unsent(`The ${name} service has too many requests outstanding; retry shortly.`)
  const perCaller = options.maxInFlight - Math.floor(options.maxInFlight * KEPT_FOR_OTHER_CALLERS)
  const callerSaturated = unsent(`This API key has ${perCaller} requests outstanding at the ${name} service, its share; retry once fewer are.`)
  /** Requests refused since the upstream became saturated: one warning when it starts, one when it ends, not one per request. */
  let refusedWhileSaturated = 0

  /** True when the upstream, and the caller's share of it, can take one more request; otherwise answers 503 without sending the request on. */
  function roomFor(reply: FastifyReply, caller: string | undefined): boolean {
    if (link.inFlight >= options.maxInFlight) {
      observer?.failure(name, 'saturated')
      if (refusedWhileSaturated++ === 0) {
        reply.log.warn({ upstream: name, maxInFlight: options.maxInFlight }, 'upstream saturated: requests refused with 503, unsent, until fewer are outstanding')
      }
      sendApiError(reply, saturated())
      return false
    }
    if (refusedWhileSaturated > 0) {
      reply.log.warn({ upstream: name, refused: refusedWhileSaturated }, 'upstream no longer saturated')
      refusedWhileSaturated = 0
    }
    // Its requests running and held back (start): bounded by its share of maxInFlight.
    if (caller !== undefined && (link.running.get(caller) ?? 0) + (link.waiting.get(caller)?.length ?? 0) >= perCaller) {
      sendApiError(reply, callerSaturated())
      return false
    }
    return true
  }

  function fail(reply: FastifyReply, error: unknown, sentBefore = false): void {
    if (reply.sent) return
    waited.delete(reply.request)
    observer?.failure(name, failureKind(error))
    const failure = upstreamFailure(error, name, sentBefore)
    reply.log.warn({ err: withoutFrames(error), code: failure.code, upstream: name }, 'upstream request failed')
    sendApiError(reply, failure)
  }

  /** The answer's status and headers onto the reply, as reply-from copied them; false when there is nobody to answer. */
  function answerHead(request: FastifyRequest, reply: FastifyReply, statusCode: number, parsed: Record<string, string | string[] | undefined>): boolean {
    if (statusCode < 100 || statusCode > 599) {
      fail(reply, new Error(`upstream answered with status ${statusCode}`))
      return false
    }
    // The client was authenticated here: an upstream 401 refuses the gateway's own credential
    // (its token differs between the services), which a client can neither cause nor fix.
    if (statusCode === 401) {
      reply.log.error(`the upstream refused the internal credential: ${options.internalTokenVariable} differs between gateway and upstream`)
      fail(reply, new Error('upstream refused the internal credential'))
      return false
    }
    // Every request body is read whole before it is forwarded, so an upstream 408 is about the
    // gateway's own connection (the pets-service's parser timing it out, as when it resumes after a
    // freeze), never the client's pace: not the client's `request_timeout`. The request did not run.
    if (statusCode === 408) {
      fail(reply, new Error('upstream answered 408: it timed out the connection before reading the request'))
      return false
    }
    // An error answer reaches the client only as the Error body: an upstream's own page (a stack
    // trace, SQL, a framework's HTML) is a broken answer, refused with 502 and kept in the log.
    if (statusCode >= 400 && !isJson(parsed['content-type'])) {
      fail(reply, new Error(`upstream answered ${statusCode} with content-type ${String(parsed['content-type'])}`))
      return false
    }
    // The hop-by-hop headers out, then @fastify/http-proxy's sanitizeHeaders, then reply-from's copyHeaders, in one pass.
    const named = connectionHeaderNames(parsed.connection)
    for (const key in parsed) {
      if (HOP_BY_HOP_SET.has(key) || ANSWER_DROPPED.has(key) || (named.length > 0 && named.includes(key)) || key.charCodeAt(0) === 58) continue
      const value = parsed[key]
      reply.header(key, typeof value === 'string' ? sanitizeHeaderValue(value) : Array.isArray(value) ? value.map(sanitizeHeaderValue) : value)
    }
    // An HTTP/1 connection cannot be reused until its request body has been read.
    if (!request.raw.complete) reply.header('connection', 'close')
    reply.code(statusCode)
    // Not request.raw.aborted: Node sets it only while the request body is unread, and the
    // gateway has read every body before forwarding it.
    return !reply.raw.destroyed
  }

  function forward(request: FastifyRequest, reply: FastifyReply, destination: string): void {
    // A client that left while its request waited in the gateway (its key looked up in a slow
    // Postgres, its address's lookups, Redis within the budget) is past hearing any answer, and
    // the exchange would never learn it: the close it listens for has come already. Sent anyway,
    // a create was stored for nobody, and a hung upstream held the request's place under
    // maxInFlight until the timeout. The access line says 499, as for a client that leaves later.
    if (clientLeft(request, reply)) return
    const raw = request.raw
    // RFC 9110 §9.3.8: TRACE's final recipient reflects the request it received in its answer, and
    // a client must not put sensitive fields into one. Forwarded, it carried INTERNAL_TOKEN and the
    // caller's key id to an upstream that honours TRACE (Apache httpd does by default), and its 200
    // handed them to the client. The gateway reflects nothing itself either.
    if (raw.method === 'TRACE') return sendApiError(reply, gatewayErrors.create('not_implemented', 'This method is not supported.'))
    const caller = request.apiKey?.id
    if (!roomFor(reply, caller)) return
    // A fragment is not part of a request target (RFC 9112 §3.2), but Node's parser lets one through.
    const target = raw.url ?? ''
    const fragmentAt = target.indexOf('#')
    const url = fragmentAt < 0 ? target : target.slice(0, fragmentAt)
    const queryAt = url.indexOf('?')
    const path = upstreamPathname(destination, base, baseHref) + (queryAt > 0 ? url.slice(queryAt) : '')

    // The gateway's own headers (gatewayHeaders) first: a server keeps only so many header
    // lines (Node: 1,000 unless told otherwise), and a client that sent a thousand must not push
    // the credential, the caller id or the prefix past that. Then the client's headers in their order minus the
    // hop-by-hop ones (RFC 9110 §7.6.1: Connection, the headers it names, Keep-Alive, Upgrade,
    // TE …) and Expect (the gateway has read the whole body, so a 100-continue expectation ends
    // here, §10.1.1), Host for the upstream, the body's length and type. Built in one pass instead
    // of a copy and deletes. undici refuses to send Keep-Alive, Upgrade or Expect at all:
    // forwarded, they turned a client's ordinary request into a 502.
    const incoming = request.headers
    const named = connectionHeaderNames(incoming.connection)
    const body = Buffer.isBuffer(request.body) ? request.body : undefined
    const headers = gatewayHeaders(request, options.internalToken)
    for (const key in incoming) {
      if (HOP_BY_HOP_SET.has(key) || key === 'expect' || key === 'authorization' || isClientDropped(key)) continue
      if (key.includes('_') && spellsDropped(key)) continue
      if (named.length > 0 && named.includes(key)) continue
      headers[key] = incoming[key]
    }
    // The client's Via, unless its Connection names it (hop-by-hop then, like any field it names).
    if (incoming.via !== undefined && !named.includes('via')) headers.via = `${incoming.via}, ${VIA}`
    headers.host = host
    // Set aside only where the header was taken away: a request that still has one (every create) is not looked up.
    const unparsed = incoming['content-type'] === undefined ? unparsedContentType.get(request) : undefined
    if (unparsed !== undefined) headers['content-type'] = unparsed
    if (body) {
      headers['content-length'] = String(body.length)
      headers['content-type'] = unparsed ?? incoming['content-type'] ?? 'application/octet-stream'
    }

    const sent: Dispatcher.DispatchOptions = {
      path,
      method: raw.method as Dispatcher.HttpMethod,
      headers,
      body: body ?? '',
      headersTimeout: options.timeoutMillis,
      bodyTimeout: options.timeoutMillis,
    }
    link.inFlight++
    new UpstreamExchange(link, request, reply, sent, caller).start()
  }

  await app.register(httpProxy, {
    upstream: options.url,
    prefix: options.publicPath,
    rewritePrefix: options.upstreamPath,
    proxyPayloads: false,
    // The upstream writes Location and Link with the public prefix it is given.
    internalRewriteLocationHeader: false,
    disableRequestLogging: true,
    // Every method the router knows goes to the upstream (TRACE excepted: forward), which owns the
    // paths below the prefix and answers 405 with the Allow header only it can get right for each.
    httpMethods: app.supportedMethods,
    // The handler below takes the query from the raw URL (as reply-from did); without it here,
    // http-proxy does not parse and re-serialise a query it would throw away.
    preRewrite: (url) => {
      const queryAt = url.indexOf('?')
      return queryAt < 0 ? url : url.slice(0, queryAt)
    },
    // Returns nothing: a returned reply is a thenable to Fastify, which then watches the
    // response with end-of-stream's five listeners per request to learn when it is done.
    handler: (request, reply, destination) => {
      forward(request, reply, destination)
    },
  })
}

/** What every exchange with one upstream shares: its name, deadline, metrics and the count of exchanges under way. */
interface UpstreamLink {
  readonly name: string
  readonly timeoutMillis: number
  readonly observer: UpstreamObserver | undefined
  /** Upstream latency per request, observed once its answer ends (answered). */
  readonly waited: WeakMap<object, number>
  /** Requests dispatched to the pool whose exchange undici has not ended yet, or held back (bounded by maxInFlight). */
  inFlight: number
  /**
   * Of those, each API key's handed to the pool (at most connectionShare); a key with none has no
   * entry. With its held-back ones, bounded by its share of maxInFlight (KEPT_FOR_OTHER_CALLERS).
   */
  readonly running: Map<string, number>
  /** Each key's requests held back, in arrival order, until one of its running ones ends; a key with none has no entry. */
  readonly waiting: Map<string, UpstreamExchange[]>
  /** The most of one key's requests handed to the pool at once: three quarters of its connections. */
  readonly connectionShare: number
  /** UpstreamOptions.honoursIdempotencyKeys. */
  readonly honoursIdempotencyKeys: boolean
  readonly pool: Dispatcher
  /** `sentBefore`: an earlier attempt of this request may have run upstream (it was resent after its connection closed unanswered). */
  fail(reply: FastifyReply, error: unknown, sentBefore?: boolean): void
  /** Observes the request's upstream latency, once, under `status`. */
  answered(request: FastifyRequest, status: number): void
  answerHead(request: FastifyRequest, reply: FastifyReply, statusCode: number, parsed: Record<string, string | string[] | undefined>): boolean
}

/**
 * One request's exchange with the upstream: undici's dispatch handler, its deadline and the
 * client's departure. A class, not a set of closures per request: its methods are made once,
 * and a closure made per request costs its allocation and, under tsx, a `__name` property
 * defined on each (esbuild's keepNames), ≈ 1 µs per proxied request in a profile.
 */
class UpstreamExchange implements Dispatcher.DispatchHandler {
  private readonly sentAt: number
  private statusCode = 0
  /** Bytes of a buffered answer so far. */
  private received = 0
  /**
   * One timer, both of the upstream's deadlines. Until its answer head: the client's 504 at the
   * timeout (undici's own headersTimeout ticks in half seconds, so a 10 s timeout answered after
   * 10.5 s), and the exchange aborted; one still waiting for a connection is aborted when it
   * gets one, before a byte is sent (a create the client was told timed out must not reach the
   * upstream later). From the head (refreshed there): the whole body within the timeout, cut
   * off with the exchange, since undici's bodyTimeout only bounds the gaps between chunks and an
   * upstream trickling a byte a second would hold it forever.
   */
  private readonly deadline: NodeJS.Timeout
  private headersIn = false
  /** Set once the answer is to stream: its head and the stream go out with its first byte. */
  private resumeUpstream: (() => void) | undefined
  private parsed: Record<string, string | string[] | undefined> | undefined
  private chunks: Buffer[] | undefined
  private stream: Readable | undefined
  private abort: ((reason?: Error) => void) | undefined
  private dropped = false
  /** Sent a second time already (resendAfterClose, or after a 408): never a third. */
  private resent = false
  /** An earlier attempt may have run upstream (its connection closed without an answer; not a 408, which did not run it). */
  private sentBefore = false
  /** The upstream answered 408 to a request that may be sent again: its answer is read and dropped, then the request resent. */
  private discarding = false
  /** Held back behind its key's running requests (start), not handed to the pool yet. */
  private queued = false
  private readonly sent: Dispatcher.DispatchOptions
  private readonly link: UpstreamLink
  /** The API key whose share of maxInFlight this exchange holds. */
  private readonly caller: string | undefined
  private readonly request: FastifyRequest
  private readonly reply: FastifyReply
  private readonly forgetClientGone: () => void
  private readonly onClientGone: () => void

  constructor(link: UpstreamLink, request: FastifyRequest, reply: FastifyReply, sent: Dispatcher.DispatchOptions, caller: string | undefined) {
    this.link = link
    this.caller = caller
    this.sent = sent
    this.request = request
    this.reply = reply
    this.sentAt = link.observer ? performance.now() : 0
    this.deadline = setTimeout(onDeadline, link.timeoutMillis, this)
    // A client gone before its answer is complete: the upstream request goes too (never sent, if
    // it still waits for a connection; cut off mid-stream), instead of holding its place under
    // maxInFlight, and the upstream's work, until the timeout or its end. The socket's 'close' as
    // well: the response of a pipelined request queued behind another is never told of it.
    this.onClientGone = this.clientGone.bind(this)
    reply.raw.once('close', this.onClientGone)
    this.forgetClientGone = onConnectionClose(request.raw.socket, this.onClientGone)
  }

  /**
   * Hands the request to the pool, or holds it back while its key has connectionShare requests
   * running. The pool serves waiting requests in arrival order: past its 128 connections, one
   * key's burst (up to its 768 places) stood ahead of every other key's request, which waited
   * seconds, to a 504 at its deadline. Held back here, they wait behind the key's own requests
   * only, their deadline running as it would in the pool's queue.
   */
  start(): void {
    const caller = this.caller
    if (caller !== undefined) {
      const running = this.link.running.get(caller) ?? 0
      if (running >= this.link.connectionShare) {
        this.queued = true
        const waiting = this.link.waiting.get(caller)
        if (waiting) waiting.push(this)
        else this.link.waiting.set(caller, [this])
        return
      }
      this.link.running.set(caller, running + 1)
    }
    this.link.pool.dispatch(this.sent, this)
  }

  /** Once, when undici ends the exchange: its places given back, and its key's next request held back sent. */
  private ended(): void {
    this.link.inFlight--
    const caller = this.caller
    if (caller === undefined) return
    const running = (this.link.running.get(caller) ?? 1) - 1
    if (running > 0) this.link.running.set(caller, running)
    else this.link.running.delete(caller)
    const waiting = this.link.waiting.get(caller)
    const next = waiting?.shift()
    if (waiting?.length === 0) this.link.waiting.delete(caller)
    if (next) {
      next.queued = false
      next.start()
    }
  }

  /** A request held back that will not be sent (its deadline, its client gone): out of its key's queue, its places given back. */
  private unqueue(): void {
    this.queued = false
    const waiting = this.caller === undefined ? undefined : this.link.waiting.get(this.caller)
    const at = waiting?.indexOf(this) ?? -1
    if (at >= 0) waiting!.splice(at, 1)
    if (waiting?.length === 0) this.link.waiting.delete(this.caller!)
    this.link.inFlight--
  }

  onDeadline(): void {
    if (this.headersIn) this.cutOff(new UpstreamDeadlineError(this.link.timeoutMillis))
    else this.cutOff(new UpstreamSilentError(this.link.timeoutMillis))
  }

  private clientGone(): void {
    this.forgetClientGone()
    if (this.reply.raw.writableFinished) return
    // The upstream answered; the client did not stay for all of it.
    this.link.answered(this.request, this.statusCode)
    if (!this.stream?.readableEnded) this.cutOff(new Error('the client went away'), true)
  }

  onConnect(abortRequest: (reason?: Error) => void): void {
    if (this.dropped) abortRequest(new UpstreamSilentError(this.link.timeoutMillis))
    else this.abort = abortRequest
  }

  onHeaders(status: number, rawHeaders: Buffer[], resume: () => void): boolean {
    if (status < 200) return true // 1xx: informational, the final answer follows
    if (this.dropped) return true // too late: answered 504 already; read and dropped
    // The upstream timed out its connection before it read the request (as a pets-service does
    // for the connections that waited while it was frozen): the request did not run.
    if (status === 408 && this.mayResend()) {
      this.discarding = true
      return true
    }
    this.statusCode = status
    if (this.link.observer) this.link.waited.set(this.request, (performance.now() - this.sentAt) / 1_000)
    const answer = undiciUtil.parseHeaders(rawHeaders) as Record<string, string | string[] | undefined>
    delete answer['transfer-encoding']
    const length = answer['content-length']
    // An error answer is always read whole, sized or not: only a body checked to be the Error
    // body reaches the client (a chunked stack trace must not stream past the check).
    const buffered =
      (status >= 400 || (typeof length === 'string' && Number(length) <= BUFFERED_ANSWER_MAX_BYTES)) &&
      answer['content-type'] !== undefined &&
      this.request.raw.method !== 'HEAD' &&
      status !== 204 &&
      status !== 304
    this.headersIn = true
    this.deadline.refresh()
    this.parsed = answer
    if (buffered) this.chunks = []
    else this.resumeUpstream = resume
    return true
  }

  onData(chunk: Buffer): boolean {
    if (this.dropped || this.discarding) return true
    if (this.chunks) {
      this.received += chunk.length
      if (this.received > BUFFERED_ANSWER_MAX_BYTES) {
        this.cutOff(new Error(`upstream answered ${this.statusCode} with a body over ${BUFFERED_ANSWER_MAX_BYTES} bytes`))
        return false
      }
      this.chunks.push(chunk)
      return true
    }
    if (!this.stream && !this.startStream()) return false
    return this.stream ? this.stream.push(chunk) : true
  }

  onComplete(): void {
    if (this.discarding && !this.dropped) return this.resend()
    this.ended()
    clearTimeout(this.deadline)
    if (this.dropped) return
    if (this.resumeUpstream) {
      if (this.stream || this.startStream()) this.stream?.push(null)
      return
    }
    const { chunks, parsed, statusCode, reply } = this
    if (!chunks || !parsed) return
    const answer = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks)
    if (statusCode >= 400 && !isErrorBody(answer, statusCode)) {
      this.link.fail(reply, new Error(`upstream answered ${statusCode} with a body that is not the Error body`))
      return
    }
    if (!this.link.answerHead(this.request, reply, statusCode, parsed)) return
    reply.send(answer)
  }

  onError(error: Error): void {
    if (this.discarding && !this.dropped) return this.resend()
    if (this.resendAfterClose(error)) return
    this.ended()
    clearTimeout(this.deadline)
    if (this.dropped) return
    if (this.stream) this.breakOff(error)
    else this.link.fail(this.reply, error, this.sentBefore)
  }

  /**
   * A kept-alive connection the upstream closes (its keep-alive timeout, a restart, a load
   * balancer draining it) can cross a request the gateway sends on it: the request arrives, the
   * connection ends, no answer. A request without side effects is then sent once more, on whichever
   * connection the pool gives next (a new one, if the upstream closed its idle ones), within the
   * same deadline, as RFC 9110 §9.2.2 allows for idempotent methods; a client of the gateway
   * cannot tell, and would otherwise get 502 for the upstream's housekeeping. A POST only with an
   * Idempotency-Key, and only to an upstream that honours one (honoursIdempotencyKeys: the
   * pets-service): sent again, it creates nothing twice (a create the upstream stored before the
   * close is answered from its first result). Without a key, or to another upstream, never: the
   * upstream may have stored it. Not a refused or timed-out connection: sending again
   * at once would meet the same.
   */
  private resendAfterClose(error: Error): boolean {
    if (this.headersIn || !this.mayResend() || !CLOSED_WITHOUT_ANSWER.has((error as { code?: unknown }).code as string)) return false
    this.sentBefore = true
    this.resend()
    return true
  }

  private mayResend(): boolean {
    if (this.resent || this.dropped) return false
    // The key as forwarded, not as the client sent it: one the client's Connection header names
    // (or one dropped on the way) never reaches the upstream, and the POST would be sent twice without it.
    if (RESENDABLE_METHODS.has(this.sent.method)) return true
    return this.sent.method === 'POST' && this.link.honoursIdempotencyKeys && (this.sent.headers as Record<string, unknown>)['idempotency-key'] !== undefined
  }

  /** The same request once more, on the connection the pool gives next, under the deadline that already runs. */
  private resend(): void {
    this.resent = true
    this.discarding = false
    this.abort = undefined
    this.link.observer?.resent?.(this.link.name)
    this.link.pool.dispatch(this.sent, this)
  }

  /**
   * The answer's head and a stream for its body, sent with its first byte (or its end): until
   * then an upstream failure is still a clean 502/504, not a 500 under the upstream's headers.
   */
  private startStream(): boolean {
    if (!this.link.answerHead(this.request, this.reply, this.statusCode, this.parsed ?? {})) {
      // Already answered (a status Node cannot send) or nobody left to answer: drop the upstream's.
      clearTimeout(this.deadline)
      this.dropped = true
      this.abort?.()
      return false
    }
    const body = new Readable({ read: () => this.resumeUpstream?.() })
    this.stream = body
    this.reply.send(body)
    return true
  }

  /**
   * Stops the exchange: 504/502 while nothing has been answered, else the stream cut short; for
   * a client that left (`byClient`), nothing is answered.
   */
  private cutOff(error: Error, byClient = false): void {
    clearTimeout(this.deadline)
    if (this.dropped) return
    this.dropped = true
    if (this.queued) this.unqueue()
    this.abort?.(error)
    if (this.stream && byClient) this.stream.destroy(error)
    else if (this.stream) this.breakOff(error)
    else if (!byClient) this.link.fail(this.reply, error, this.sentBefore)
  }

  /**
   * The upstream's streamed answer broken off: the client gets it cut short. Its head has gone
   * out by then: the stream starts with the first chunk, its head leaves at the end of that turn
   * (coalescedWrites), and an upstream's failure reaches this handler only in a later phase of
   * the loop (a socket's error after its close; the deadline's timer).
   */
  private breakOff(error: Error): void {
    this.link.waited.delete(this.request)
    this.link.observer?.failure(this.link.name, failureKind(error))
    this.reply.log.warn({ err: error }, 'upstream answer broken off after its head was sent')
    this.stream?.destroy(error)
  }
}

/** Whether the client's connection has closed (or its answer was destroyed) before its request was sent on. */
function clientLeft(request: FastifyRequest, reply: FastifyReply): boolean {
  return reply.raw.destroyed || request.raw.socket === null || request.raw.socket.destroyed
}

/** Methods without side effects (RFC 9110 §9.2.1): sent again when their connection closed without an answer (a POST only as mayResend says). */
const RESENDABLE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])
/** undici's and the socket's codes for a connection that ended without an answer to the request sent on it. */
const CLOSED_WITHOUT_ANSWER = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE'])

function onDeadline(exchange: UpstreamExchange): void {
  exchange.onDeadline()
}
