import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { ClientTimeouts } from '../../../common/src/http/clientErrors.ts'
import { onConnectionClose } from '../../../common/src/http/connectionClose.ts'
import { expectsContinue } from '../../../common/src/http/expectContinue.ts'
import { excessHeaderLines } from '../../../common/src/http/headerLines.ts'
import { markNotCarriedOut } from '../../../common/src/http/requestContext.ts'
import { gatewayErrors } from '../errors.ts'

/**
 * The first field of those a request may carry once (RFC 9110 §5.3) that it carries twice; Node
 * keeps the first copy and drops the rest without a word. Names are compared by length first:
 * this runs on every request.
 */
function repeatedSingleton(rawHeaders: string[]): string | undefined {
  let hosts = 0
  let authorizations = 0
  let contentTypes = 0
  for (let index = 0; index < rawHeaders.length; index += 2) {
    const name = rawHeaders[index] as string
    if (name.length === 4 && name.toLowerCase() === 'host' && ++hosts > 1) return 'Host'
    if (name.length === 13 && name.toLowerCase() === 'authorization' && ++authorizations > 1) return 'Authorization'
    if (name.length === 12 && name.toLowerCase() === 'content-type' && ++contentTypes > 1) return 'Content-Type'
  }
  return undefined
}

/**
 * Whether a request's body claims a transfer coding besides chunked (`gzip, chunked`), which
 * Node's parser accepts and does not decode: it removes the chunked framing alone. Empty list
 * elements (`, chunked`) name no coding (RFC 9110 §5.6.1), and Node's parser skips them too.
 */
function undecodedTransferCoding(transferEncoding: string | undefined): boolean {
  if (transferEncoding === undefined) return false
  for (const part of transferEncoding.split(',')) {
    const coding = part.trim().toLowerCase()
    if (coding !== '' && coding !== 'chunked') return true
  }
  return false
}

/** The 501 for a body under a transfer coding besides chunked (RFC 9112 §6.1), as the OpenAPI document shows it. */
export const TRANSFER_CODING_NOT_DECODED = 'No transfer coding but chunked is supported; send the body chunked or with a Content-Length.'

/**
 * RFC 9110 §15.6.6, RFC 9112 §2.3: a request line naming a major version other than 1. Node's
 * parser takes `HTTP/0.9` and `HTTP/2.0` and reads the message by HTTP/1.0's rules, so it was
 * served as one, without the Host check an HTTP/1.1 request gets (neither is what its line says:
 * HTTP/0.9 has no version in its request line, HTTP/2 is binary framing). Refused with 505 and the
 * Error body once charged like any other, ahead of the key's 401 (a key would not help), and the
 * connection closed after the answer (closesAfterAnswer).
 */
export const protocolVersion = fp(
  async (app: FastifyInstance) => {
    app.addHook('onRequest', (request, _reply, done) => {
      if (request.raw.httpVersionMajor !== 1) return done(gatewayErrors.create('http_version_not_supported'))
      done()
    })
  },
  { name: 'protocol-version' },
)

/**
 * RFC 9110 §7.2 (`uri-host [ ":" port ]`, RFC 3986 §3.2.2): a name of unreserved, percent-encoded
 * and sub-delimiter characters, or an address in brackets, and digits after a colon. RFC 9112 §3.2:
 * a Host that is not one (`a b`, `evil.example/../x@y`) MUST be answered 400; one that is empty
 * is allowed (a URI without an authority).
 */
const HOST_AND_PORT = /^(?:\[[0-9A-Za-z:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?$/

/**
 * Requests the gateway will not pass on as they stand, refused with 400 and the Error body once
 * they have been charged like any other (RFC 9112): an HTTP/1.1 request without Host (§3.2), one
 * whose Host is no host and port (§3.2, HOST_AND_PORT),
 * two Host fields (§3.2), two Authorization fields, which one server would read as the first
 * key and another as the second, or two Content-Type fields (one server's JSON, another's text).
 * A body with a transfer coding besides chunked is refused with 501 (§6.1): forwarded, it reached
 * the upstream still coded but sized and described as if it were not (a gzip body as JSON).
 * An HTTP/1.0 request framed with Transfer-Encoding, or asking to upgrade, is answered and then
 * its connection closed: pipelinedBehindClose says so, as every answer to one must, a refusal too.
 */
export const requestFraming = fp(
  async (app: FastifyInstance) => {
    app.addHook('onRequest', (request, reply, done) => {
      const raw = request.raw
      if (raw.httpVersion === '1.1' && raw.headers.host === undefined) {
        return done(gatewayErrors.create('bad_request', 'An HTTP/1.1 request needs a Host header.'))
      }
      if (raw.headers.host !== undefined && !HOST_AND_PORT.test(raw.headers.host)) {
        return done(gatewayErrors.create('bad_request', 'The Host header must be a host name or address, and a port if any.'))
      }
      const repeated = repeatedSingleton(raw.rawHeaders)
      if (repeated !== undefined) return done(gatewayErrors.create('bad_request', `The ${repeated} header may be sent only once.`))
      if (undecodedTransferCoding(raw.headers['transfer-encoding'])) {
        return done(gatewayErrors.create('not_implemented', TRANSFER_CODING_NOT_DECODED))
      }
      done()
    })
  },
  { name: 'request-framing' },
)

/**
 * Whether the answer to this request, whatever it is, closes its connection: an HTTP/1.0 request
 * framed with Transfer-Encoding (RFC 9112 §6.1: its framing cannot be trusted); one of the other
 * versions Node's parser takes (`HTTP/0.9`, `HTTP/2.0` in a request line), which it keeps alive by
 * HTTP/1.0's rules, refused by protocolVersion; one asking to upgrade: the gateway upgrades to nothing and answers as HTTP/1.1
 * (RFC 9110 §7.8), but Node's parser stops reading the connection after such a request, and one
 * pipelined behind it would wait unanswered (closing after the answer tells the client to send it
 * again); and a request with more header lines than are read, whose 431 (headerLineLimit) closes
 * the connection.
 */
function closesAfterAnswer(raw: IncomingMessage): boolean {
  return (
    raw.headers.upgrade !== undefined ||
    raw.httpVersionMajor !== 1 ||
    (raw.httpVersion !== '1.1' && raw.headers['transfer-encoding'] !== undefined) ||
    excessHeaderLines(raw)
  )
}

/**
 * Whether an HTTP/1.1 request expects 100-continue: Node closes the connection after a final answer
 * sent without the 100, since the client may or may not have sent the body. With closesAfterAnswer,
 * the requests whose answer may close a connection that asked for keep-alive.
 */
function waitsForContinue(raw: IncomingMessage): boolean {
  const expectation = raw.headers.expect
  return expectation !== undefined && raw.httpVersion !== '1.0' && expectsContinue(expectation)
}

/**
 * Requests read from one connection and not answered yet, past which the gateway stops reading it
 * until half of them have been answered (pipelinedBehindClose).
 */
export const MAX_UNANSWERED_PER_CONNECTION = 128

/** The flag Node's HTTP server pauses a connection with, and its parser (internal, stable since Node 0.x). */
type PausableSocket = Socket & { _paused?: boolean; parser?: { resume(): void } | null }

/** RFC 9110 §9.2.1 (and QUERY): requests that change nothing, which may be carried out side by side. */
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'QUERY'])

/** Node's own record of the answer a connection is writing (internal, stable since Node 0.x). */
function answerWriting(socket: Socket): ServerResponse | null | undefined {
  return (socket as { _httpMessage?: ServerResponse | null })._httpMessage
}

/** Per connection, the unsafe requests waiting for the answers ahead of theirs, in request order. */
const waitingForAnswersAhead = new WeakMap<Socket, { answer: ServerResponse; go: () => void }[]>()

/**
 * Calls `go` once every answer queued ahead of `answer` on its connection has been sent: Node gives
 * a pipelined request's answer the socket only then, one answer at a time, in request order. Also
 * once an answer ahead closed the connection, or the client left. One 'finish' listener per
 * connection, on the answer being written, however many requests wait: one each on that answer
 * printed MaxListenersExceededWarning past ten, and every answer sent woke every waiting request
 * (2,000 creates pipelined on one connection took 30 s of the gateway's time instead of 0.7 s).
 */
function afterAnswersAhead(socket: Socket, answer: ServerResponse, go: () => void): void {
  const writing = answerWriting(socket)
  if (answer.socket !== null || !writing || !socket.writable) return go()
  const already = waitingForAnswersAhead.get(socket)
  if (already !== undefined) return void already.push({ answer, go })
  const queue = [{ answer, go }]
  waitingForAnswersAhead.set(socket, queue)
  let watched: ServerResponse | null | undefined = writing
  const next = () => {
    watched?.off('finish', next)
    // Requests are handed the socket in order: the first waiting one is the next to have it.
    for (let first = queue[0]; first !== undefined; first = queue[0]) {
      if (first.answer.socket === null && answerWriting(socket) && socket.writable) break
      queue.shift()
      first.go()
    }
    watched = answerWriting(socket)
    if (queue.length > 0 && watched) return void watched.once('finish', next)
    waitingForAnswersAhead.delete(socket)
    forgetClose()
  }
  // After Node's own 'finish' listener, which hands the socket on to the next answer or ends it.
  writing.once('finish', next)
  const forgetClose = onConnectionClose(socket, next)
}

/**
 * RFC 9112 §9.6: once a server closes a connection after an answer, it carries out none of the
 * requests pipelined behind it, whose answers could never be sent. Node's parser reads on after a
 * request that asked for keep-alive, whatever its answer then says, and hands the next request
 * over at once: a create pipelined behind one of the answers above stored a pet its client was
 * never told about, and was charged to its key. A request queued behind such an answer waits for
 * it (only then is it known whether the connection stays open) and is carried out only if the
 * connection does; otherwise it ends here, before it is charged, with a 400 that is logged and
 * never delivered.
 * RFC 9112 §9.3.2: pipelined requests are carried out side by side only when all are safe. Node
 * hands them all over at once, so a read pipelined behind a create ran alongside it and, more often
 * than not, answered 404 for the pet the 201 before it had just announced. A request queued behind
 * an unsafe one waits the same way, and an unsafe request waits for every answer ahead of it. One
 * queue does all the waiting (afterAnswersAhead). Safe requests behind safe ones are carried out at
 * once.
 * Registered after httpMetrics (whose hook counts such a request when its connection closes) and
 * before authentication and the rate limit, whose refusals must close the connection too.
 */
export const pipelinedBehindClose = fp(
  async (app: FastifyInstance, options: { timeouts: ClientTimeouts }) => {
    /**
     * Per connection, the last answer that may close it, or that follows an unsafe request: while
     * it is unsent, a request pipelined behind it waits for the answers ahead (afterAnswersAhead).
     */
    const holdingBack = new WeakMap<Socket, ServerResponse>()
    const notCarriedOut = () => gatewayErrors.create('bad_request', 'A request pipelined behind an answer that closed the connection is not carried out.')
    /**
     * Per connection, its requests read and queued behind an answer not sent yet. Node stops
     * reading a connection only once the answers it owes pile up, and requests waiting on a slow or
     * hung dependency (a key looked up in a Postgres that does not answer) or on the answers ahead
     * of them (creates) owe none yet: every request a client pipelined was read and held, 4 MB of GETs on one connection
     * 150 MB of heap until the lookup failed. Past the bound the connection is paused as Node pauses
     * it (its `_paused` flag, so its parser stops after this read), and read again once half of them
     * have been answered: the requests wait in the client's socket, not in the gateway's heap. What
     * was read already (at most one read's worth) is carried out as usual. Node resumes a paused
     * connection whenever an answer leaves it (its own pause is for answers piling up): while held
     * here, those resumes wait for this one.
     * A read seldom ends where a request does, and Node's clocks for a request's headers and for the
     * whole of it run from its first byte read, also while its connection is held: held longer, a
     * request the client had sent whole and in time was refused 408 and the connection closed,
     * the requests behind it never answered. So a hold lasts at most half the shorter of the two,
     * then the connection is read again (the rest of that request, and at most one read more).
     */
    const unanswered = new WeakMap<Socket, number>()
    /** Held connections, each with the timer that reads it again at the latest. */
    const held = new WeakMap<Socket, NodeJS.Timeout | undefined>()
    // A clock set to 0 does not run (Node's and Fastify's meaning).
    const clocks = [options.timeouts.headersTimeoutMillis, options.timeouts.requestTimeoutMillis].filter((millis) => millis > 0)
    const longestHoldMillis = clocks.length > 0 ? Math.max(1, Math.floor(Math.min(...clocks) / 2)) : undefined
    const holdBack = (socket: PausableSocket) => {
      if (held.has(socket) || socket.destroyed) return
      if (!Object.hasOwn(socket, 'resume')) {
        const resume = socket.resume
        socket.resume = function (this: PausableSocket) {
          return held.has(this) ? this : resume.call(this)
        }
      }
      held.set(socket, longestHoldMillis === undefined ? undefined : setTimeout(readOn, longestHoldMillis, socket).unref())
      socket._paused = true
      socket.pause()
    }
    function readOn(socket: PausableSocket): void {
      if (!held.has(socket)) return
      clearTimeout(held.get(socket))
      held.delete(socket)
      if (socket.destroyed) return
      socket._paused = false
      socket.parser?.resume()
      socket.resume()
    }

    function countUnanswered(socket: Socket, answer: ServerResponse): void {
      const outstanding = (unanswered.get(socket) ?? 0) + 1
      unanswered.set(socket, outstanding)
      if (outstanding > MAX_UNANSWERED_PER_CONNECTION) holdBack(socket)
      answer.once('close', () => {
        const left = (unanswered.get(socket) ?? 1) - 1
        unanswered.set(socket, left)
        if (left === Math.floor(MAX_UNANSWERED_PER_CONNECTION / 2)) readOn(socket)
      })
    }

    /** Once the answers ahead have gone: on with the request if its connection is still open. */
    function carryOutIfOpen(socket: Socket, answer: ServerResponse, done: (error?: Error) => void): void {
      if (socket.writable && !socket.destroyed) return done()
      const refusal = notCarriedOut()
      markNotCarriedOut(answer, refusal.status)
      done(refusal)
    }

    app.addHook('onRequest', (request, reply, done) => {
      const socket = request.raw.socket
      // Only a request queued behind an answer still owed is counted: the answer of one read alone
      // on its connection (nearly every request) has the socket already, and costs nothing here.
      if (reply.raw.socket === null) countUnanswered(socket, reply.raw)
      const ahead = holdingBack.get(socket)
      const behindHeldAnswer = ahead !== undefined && !ahead.writableFinished
      // Here, ahead of authentication and the rate limit: a 401 or 429 to such a request kept the
      // connection open, and a create pipelined behind an HTTP/1.0 request framed with
      // Transfer-Encoding was carried out (behind an upgrade, it waited unanswered).
      const closes = closesAfterAnswer(request.raw)
      if (closes) reply.header('connection', 'close')
      const unsafe = !SAFE_METHODS.has(request.raw.method as string)
      if (closes || unsafe || waitsForContinue(request.raw)) holdingBack.set(socket, reply.raw)
      else if (ahead !== undefined && !behindHeldAnswer) holdingBack.delete(socket)
      // An unsafe request waits for every answer ahead, safe ones too: a create carried out beside
      // a list pipelined ahead of it put its pet in that list. Nothing is ahead once its answer has
      // the socket.
      if ((!unsafe && !behindHeldAnswer) || reply.raw.socket !== null) return done()
      afterAnswersAhead(socket, reply.raw, () => carryOutIfOpen(socket, reply.raw, done))
    })
  },
  { name: 'pipelined-behind-close' },
)
