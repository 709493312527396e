import type { Socket } from 'node:net'
import type { FastifyBaseLogger } from 'fastify'
import type { ApiError } from './apiError.ts'

export interface ClientErrorCodes {
  badRequest: () => ApiError
  headersTooLarge: () => ApiError
  requestTimeout: () => ApiError
}

const REASONS: Record<number, string> = { 400: 'Bad Request', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' }

/**
 * What Node's HTTP parser rejects before Fastify sees a request (headers over 16 KiB, a
 * client too slow to send its headers or body, bytes that are not HTTP) still gets the
 * spec's Error body instead of Node's bare status line, and one log line like every answer
 * (no request id or route exists yet: the client's address and the parser's reason instead).
 */
export function clientErrorHandler(codes: ClientErrorCodes, log?: Pick<FastifyBaseLogger, 'info'>) {
  const refusing = new WeakSet<Socket>()
  return (error: NodeJS.ErrnoException, socket: Socket): void => {
    if (error.code === 'ECONNRESET' || !socket.writable || refusing.has(socket)) return
    refusing.add(socket)
    // Requests pipelined ahead of the bad bytes are already running: their answers go first
    // (RFC 9112 §9.3.2), or the client would read this refusal as the answer to a request that
    // was in fact carried out (a create it would then retry).
    afterAnswersOwed(socket, () => {
      if (!socket.writable) return
      // Bytes after a request that said `Connection: close` are not a request (RFC 9112 §9.6).
      if (error.code === 'HPE_CLOSED_CONNECTION') return void socket.end()
      refuse(codes, error, socket, log)
    })
  }
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

function refuse(codes: ClientErrorCodes, error: NodeJS.ErrnoException, socket: Socket, log?: Pick<FastifyBaseLogger, 'info'>): void {
  const apiError =
    error.code === 'HPE_HEADER_OVERFLOW'
      ? codes.headersTooLarge()
      : error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? codes.requestTimeout()
        : codes.badRequest()
  log?.info({ status: apiError.status, code: apiError.code, reason: error.code, remoteAddress: socket.remoteAddress }, 'request refused by the HTTP parser')
  const body = JSON.stringify(apiError.toBody())
  socket.end(
    [
      `HTTP/1.1 ${apiError.status} ${REASONS[apiError.status] ?? 'Bad Request'}`,
      'Content-Type: application/json; charset=utf-8',
      `Content-Length: ${Buffer.byteLength(body)}`,
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
}

/** Slow clients are cut off: headers within 10 s, the whole request within 30 s. */
export const CLIENT_TIMEOUTS: Readonly<ClientTimeouts> = { headersTimeoutMillis: 10_000, requestTimeoutMillis: 30_000 }

/**
 * Node looks for expired headers and requests only every `connectionsCheckingInterval` (30 s by
 * default), so a slowloris client would be cut off up to 30 s after its timeout. Checking every
 * tenth of the shorter timeout (at most every second) keeps the cut within 10 % of the bound.
 */
export function connectionsCheckingIntervalMillis(timeouts: ClientTimeouts): number {
  return Math.max(50, Math.min(1_000, Math.floor(Math.min(timeouts.headersTimeoutMillis, timeouts.requestTimeoutMillis) / 10)))
}
