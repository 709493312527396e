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
  return (error: NodeJS.ErrnoException, socket: Socket): void => {
    if (error.code === 'ECONNRESET' || !socket.writable) return
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
