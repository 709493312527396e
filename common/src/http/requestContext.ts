import { randomUUID } from 'node:crypto'
import { LogController, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

/**
 * Anything shaped like one of the product's API keys (gateway/src/keys/apiKeyFormat.ts): `aas_`
 * and 16+ base62 characters, in any case (`AAS_<key body>` would leave only the prefix to guess).
 */
const KEY_LIKE = /aas_[0-9a-z]{16}/i

/**
 * Reuses a well-formed `X-Request-Id` from the caller (the gateway) so one id follows a request,
 * unless it looks like an API key: a client that sends its key there gets a fresh id, and the key
 * reaches no log line and no upstream.
 */
export function requestIdFrom(request: { headers: Record<string, string | string[] | undefined> }): string {
  const incoming = request.headers['x-request-id']
  return typeof incoming === 'string' && REQUEST_ID.test(incoming) && !KEY_LIKE.test(incoming) ? incoming : randomUUID()
}

/** Turns off Fastify's two lines per request; `requestContext` writes one instead. */
export function singleLineRequestLogging(): LogController {
  return new LogController({ disableRequestLogging: true, requestIdLogLabel: 'requestId' })
}

/** The status logged and counted (nginx's) for a request whose client left before any answer. */
export const CLIENT_CLOSED_REQUEST = 499

const ACCOUNTED = Symbol('answer accounted for')
type Accountable = { [ACCOUNTED]?: true }

/**
 * Marks an answer that has its log line and count already: Fastify ran onResponse for it (the
 * answer finished), or the HTTP parser refused the request mid-body and that refusal is its line.
 * A property, not `writableFinished`: an injected request (light-my-request) never reads as
 * finished, and would be counted twice.
 */
export function markAccounted(response: object): void {
  ;(response as Accountable)[ACCOUNTED] = true
}

/**
 * Calls `record` with a status and a message when an answer ends without being sent whole, which
 * Fastify's onResponse never sees, so the request would have no log line and no count: the client
 * left before any answer (499: it gave up on a slow upstream, or reset the connection right after
 * sending), or an answer already under way was cut short (the upstream broke off, or the client
 * left mid-body), logged with the status it had started with. The plugin calling it marks its
 * answers accounted for in onResponse.
 */
export function whenAnswerCutShort(reply: FastifyReply, record: (status: number, message: string) => void): void {
  const response = reply.raw
  response.once('close', () => {
    if ((response as Accountable)[ACCOUNTED] || response.writableFinished) return
    if (response.headersSent) record(reply.statusCode, 'answer cut short')
    else record(CLIENT_CLOSED_REQUEST, 'request aborted by the client')
  })
}

/**
 * One JSON log line per request (Fastify's default is two) and the request id echoed back.
 * Extra fields (the gateway adds key id and plan) come from `logFields`.
 */
export const requestContext = fp(
  async (app: FastifyInstance, options: { logFields?: (request: FastifyRequest) => Record<string, unknown> }) => {
    function log(request: FastifyRequest, reply: FastifyReply, status: number, message: string): void {
      request.log.info(
        {
          method: request.method,
          route: request.routeOptions.url ?? 'unmatched',
          status,
          durationMs: Math.round(reply.elapsedTime * 100) / 100,
          ...options.logFields?.(request),
        },
        message,
      )
    }
    // Callback-style hooks: on the hot path they cost less than async ones (no promise per call).
    app.addHook('onRequest', (request, reply, done) => {
      reply.header('x-request-id', request.id)
      whenAnswerCutShort(reply, (status, message) => log(request, reply, status, message))
      done()
    })
    app.addHook('onResponse', (request, reply, done) => {
      markAccounted(reply.raw)
      log(request, reply, reply.statusCode, 'request completed')
      done()
    })
  },
  { name: 'request-context' },
)
