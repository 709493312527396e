import type { IncomingMessage } from 'node:http'
import type { Socket } from 'node:net'
import type { FastifyBaseLogger } from 'fastify'
import type { ApiError } from './apiError.ts'
import { markRefusedByParser } from './requestContext.ts'

export interface ClientErrorCodes {
  badRequest: () => ApiError
  headersTooLarge: () => ApiError
  /** The request line alone is past the 16 KiB the parser reads (RFC 9110 §15.5.15: 414, not 431). */
  uriTooLong: () => ApiError
  requestTimeout: () => ApiError
  /**
   * A well-formed request line whose method the server does not implement: one Node's parser does
   * not know (`FOO / HTTP/1.1`) or CONNECT (see refuseConnect). Without it both are 400.
   */
  methodNotImplemented?: () => ApiError
}

const REASONS: Record<number, string> = {
  400: 'Bad Request',
  408: 'Request Timeout',
  414: 'URI Too Long',
  431: 'Request Header Fields Too Large',
  501: 'Not Implemented',
}

/** The start of a request line (`METHOD target`), which no header line (`Name: value`) looks like. */
const REQUEST_LINE_START = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+ /

/** `METHOD target HTTP/x.y`: a request line whose only fault is a method token Node does not know. */
const REQUEST_LINE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [^\s]+ HTTP\/\d\.\d\r?\n/

/**
 * What Node's HTTP parser rejects before Fastify sees a request (headers over 16 KiB, a
 * client too slow to send its headers or body, bytes that are not HTTP) still gets the
 * spec's Error body instead of Node's bare status line, and one log line like every answer
 * (no request id or route exists yet: the client's address and the parser's reason instead).
 */
export function clientErrorHandler(codes: ClientErrorCodes, log?: Pick<FastifyBaseLogger, 'info'>, onRefused?: (status: number) => void) {
  const refusing = new WeakSet<Socket>()
  return (error: NodeJS.ErrnoException, socket: Socket): void => {
    if (handshakeUnfinished(socket)) return void socket.destroy()
    if (error.code === 'ECONNRESET' || !socket.writable || refusing.has(socket)) return
    refusing.add(socket)
    // Requests pipelined ahead of the bad bytes are already running: their answers go first
    // (RFC 9112 §9.3.2), or the client would read this refusal as the answer to a request that
    // was in fact carried out (a create it would then retry).
    afterAnswersOwed(socket, () => {
      if (!socket.writable) return
      // Bytes after a request that said `Connection: close` are not a request (RFC 9112 §9.6).
      if (error.code === 'HPE_CLOSED_CONNECTION') return void socket.end()
      refuse(codes, error, socket, log, onRefused)
    })
  }
}

/**
 * An HTTPS server passes a failed or timed-out TLS handshake (tlsClientError) on as clientError,
 * and leaves closing the connection to the listener. There is no HTTP in it to answer: an answer
 * written would wait for a handshake that never comes, and the connection would stay open for
 * good (a handshake timeout that never frees anything, and a close() that waits on it). Node's
 * own flag for a completed handshake (internal, stable since Node 0.x).
 */
function handshakeUnfinished(socket: Socket): boolean {
  const tls = socket as Socket & { encrypted?: boolean; _secureEstablished?: boolean }
  return tls.encrypted === true && tls._secureEstablished !== true
}

/** The answer being written on a connection, as Node's own clientError default finds it. */
type AnswerInFlight = NodeJS.EventEmitter & { writableFinished: boolean; req?: { complete: boolean } }
type WithAnswerInFlight = Socket & { _httpMessage?: AnswerInFlight | null }

/**
 * Runs `then` once every answer already owed on this connection has been written: one is owed to
 * each request that arrived whole. A request cut short by the bad bytes (a broken chunk, a body
 * that never came) is the one being refused, so its refusal goes at once.
 */
function afterAnswersOwed(socket: Socket, then: () => void): void {
  const inFlight = (socket as WithAnswerInFlight)._httpMessage
  if (!inFlight || inFlight.writableFinished || inFlight.req?.complete !== true) return then()
  // Node hands the socket to the next pipelined answer on 'finish'; look again after it has.
  inFlight.once('finish', () => setImmediate(() => afterAnswersOwed(socket, then)))
}

/**
 * Node's HTTP server closes a connection that asks for CONNECT without a word unless something
 * listens for it. Neither service is a forward proxy, so CONNECT is a method they do not
 * implement: 501 with the Error body (RFC 9110 §9.1), then the connection closes.
 */
export function refuseConnect(codes: ClientErrorCodes, log?: Pick<FastifyBaseLogger, 'info'>, onRefused?: (status: number) => void) {
  return (request: IncomingMessage, socket: Socket): void => {
    afterAnswersOwed(socket, () => {
      if (!socket.writable) return
      const apiError = (codes.methodNotImplemented ?? codes.badRequest)()
      onRefused?.(apiError.status)
      answer(apiError, socket, log, 'CONNECT', `request refused: ${request.method} is not supported`)
    })
  }
}

type ParseError = NodeJS.ErrnoException & { rawPacket?: Buffer; bytesParsed?: number }

function refusalFor(codes: ClientErrorCodes, error: ParseError, socket: Socket): ApiError {
  if (error.code === 'HPE_HEADER_OVERFLOW') {
    const line = refusedRequestLine(error)
    // The parser ran out of room inside a line that is still the request line: a target too long.
    // Only when that line's start is in view: in these bytes after a line feed, or at the start of
    // the connection's first read. A line that began in an earlier read may be any header.
    const { rawPacket, bytesParsed = 0 } = error
    const startSeen = rawPacket !== undefined && (rawPacket.lastIndexOf(0x0a, Math.max(0, bytesParsed - 1)) >= 0 || socket.bytesRead === rawPacket.length)
    return startSeen && REQUEST_LINE_START.test(line) && !line.includes('\n') ? codes.uriTooLong() : codes.headersTooLarge()
  }
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') return codes.requestTimeout()
  if (error.code === 'HPE_INVALID_METHOD' && codes.methodNotImplemented && REQUEST_LINE.test(refusedRequestLine(error))) {
    return codes.methodNotImplemented()
  }
  return codes.badRequest()
}

/** The line the parser stopped in: the bytes it was given may begin with requests pipelined ahead. */
function refusedRequestLine({ rawPacket, bytesParsed }: ParseError): string {
  if (rawPacket === undefined || bytesParsed === undefined) return ''
  const start = rawPacket.lastIndexOf(0x0a, Math.max(0, bytesParsed - 1)) + 1
  return rawPacket.toString('latin1', start, start + 8_192)
}

function refuse(
  codes: ClientErrorCodes,
  error: NodeJS.ErrnoException,
  socket: Socket,
  log?: Pick<FastifyBaseLogger, 'info'>,
  onRefused?: (status: number) => void,
): void {
  const refusal = refusalFor(codes, error, socket)
  // A request whose body never came whole: this refusal is its answer and its line, and it is
  // counted with the routed requests. Any other never reached a route: counted apart.
  const cutShort = (socket as WithAnswerInFlight)._httpMessage
  if (cutShort && !cutShort.writableFinished) markRefusedByParser(cutShort, refusal.status)
  else onRefused?.(refusal.status)
  answer(refusal, socket, log, error.code, 'request refused by the HTTP parser')
}

function answer(apiError: ApiError, socket: Socket, log: Pick<FastifyBaseLogger, 'info'> | undefined, reason: string | undefined, message: string): void {
  log?.info({ status: apiError.status, code: apiError.code, reason, remoteAddress: socket.remoteAddress }, message)
  const body = apiError.toJson()
  socket.end(
    [
      `HTTP/1.1 ${apiError.status} ${REASONS[apiError.status] ?? 'Bad Request'}`,
      'Content-Type: application/json; charset=utf-8',
      `Content-Length: ${Buffer.byteLength(body)}`,
      // As on every other answer (the README's Caching): never sniffed as HTML, never kept by a cache.
      'X-Content-Type-Options: nosniff',
      'Cache-Control: no-store',
      'Connection: close',
      '',
      body,
    ].join('\r\n'),
  )
}

export interface ClientTimeouts {
  /** The request line and headers must have arrived within this time of the request's start. */
  headersTimeoutMillis: number
  /** The whole request, body included, must have arrived within this time. */
  requestTimeoutMillis: number
  /** A connection on which nothing moves for this long is cut off (cutStalledConnections: an answer the client stops reading). */
  stalledMillis: number
}

/** Slow clients are cut off: headers within 10 s, the whole request within 30 s, an answer left unread after 60 s. */
export const CLIENT_TIMEOUTS: Readonly<ClientTimeouts> = { headersTimeoutMillis: 10_000, requestTimeoutMillis: 30_000, stalledMillis: 60_000 }

/**
 * Node looks for expired headers and requests only every `connectionsCheckingInterval` (30 s by
 * default), so a slowloris client would be cut off up to 30 s after its timeout. Checking every
 * tenth of the shorter timeout (at most every second) keeps the cut within 10 % of the bound.
 */
export function connectionsCheckingIntervalMillis(timeouts: ClientTimeouts): number {
  return Math.max(50, Math.min(1_000, Math.floor(Math.min(timeouts.headersTimeoutMillis, timeouts.requestTimeoutMillis) / 10)))
}
