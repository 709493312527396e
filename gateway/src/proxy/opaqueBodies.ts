import type { IncomingMessage } from 'node:http'
import { errorCodes, type FastifyInstance, type FastifyRequest } from 'fastify'
import { gatewayErrors } from '../errors.ts'

/** The largest request body the gateway reads (413 past it, before any upstream is contacted). */
export const BODY_LIMIT_BYTES = 1_048_576

/**
 * The most pieces a body may arrive in (chunks, or reads of one trickled in small segments): a
 * 1 MiB body in pieces of 16 bytes on average, 413 past it. Each piece is an event and a copy;
 * a body of a million 1-byte chunks (6 MB on the wire, 1 MB of payload, within the limit) took
 * 1.5 s of the gateway's CPU, and Fastify's reader kept each piece as a Buffer of its own, 250
 * bytes apiece: 400 MB of memory for one request, 4.8 GB for twenty from one Free key.
 */
export const MAX_BODY_PIECES = 65_536

// Not "larger than 1 MiB": the body may be far smaller, and the client is told what to change.
const TOO_MANY_PIECES = `The request body arrived in more than ${MAX_BODY_PIECES.toLocaleString('en')} pieces; send it in larger chunks, or with a Content-Length.`

/** The first buffer for a body of unknown length (chunked); it doubles as the body grows. */
const INITIAL_BODY_BYTES = 16_384
/**
 * The most reserved for a body before its bytes arrive: a Content-Length is only what the client
 * says, and 500 connections announcing 1 MiB and sending 2 bytes held 500 MB.
 */
const MOST_RESERVED_AHEAD_BYTES = 65_536

type Done = (error: Error | null, body?: Buffer) => void

/**
 * Bodies are bytes to forward, never parsed here: read whole (at most 1 MiB in at most
 * MAX_BODY_PIECES pieces, else 413) whatever their type. The gateway's own routes ignore them, so
 * a POST of broken JSON to a path that does not exist is a 404 (or a 405), not a JSON parse error.
 */
export function acceptOpaqueBodies(app: FastifyInstance): void {
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (request: FastifyRequest, payload: IncomingMessage, done: Done) => readWhole(request, payload, done))
}

/**
 * The body copied into one buffer as it arrives, as Fastify's own reader checks it (the length
 * announced, at most the limit, a stream error a 400) but without keeping the pieces.
 */
function readWhole(request: FastifyRequest, payload: IncomingMessage, done: Done): void {
  const announced = Number(request.headers['content-length'])
  if (announced > BODY_LIMIT_BYTES) return done(new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE())
  const most = Number.isNaN(announced) ? BODY_LIMIT_BYTES : announced
  let body = Buffer.allocUnsafe(Number.isNaN(announced) ? INITIAL_BODY_BYTES : Math.min(announced, MOST_RESERVED_AHEAD_BYTES))
  let length = 0
  let pieces = 0
  const finish = (error: Error | null, whole?: Buffer) => {
    payload.removeListener('data', onData)
    payload.removeListener('end', onEnd)
    payload.removeListener('error', onEnd)
    done(error, whole)
  }
  function onData(piece: Buffer): void {
    pieces++
    if (length + piece.length > BODY_LIMIT_BYTES) return finish(new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE())
    if (pieces > MAX_BODY_PIECES) return finish(gatewayErrors.create('payload_too_large', TOO_MANY_PIECES))
    if (length + piece.length > body.length) {
      // Past an announced length the body is refused at its end (FST_ERR_CTP_INVALID_CONTENT_LENGTH).
      const grown = Buffer.allocUnsafe(Math.max(Math.min(most, 2 * body.length), length + piece.length))
      body.copy(grown, 0, 0, length)
      body = grown
    }
    piece.copy(body, length)
    length += piece.length
  }
  function onEnd(error?: Error & { statusCode?: number }): void {
    if (error) {
      if (!(typeof error.statusCode === 'number' && error.statusCode >= 400)) error.statusCode = 400
      return finish(error)
    }
    if (!Number.isNaN(announced) && length !== announced) return finish(new errorCodes.FST_ERR_CTP_INVALID_CONTENT_LENGTH())
    finish(null, body.subarray(0, length))
  }
  payload.on('data', onData)
  payload.on('end', onEnd)
  payload.on('error', onEnd)
  payload.resume()
}
