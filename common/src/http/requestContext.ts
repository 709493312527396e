import { randomUUID } from 'node:crypto'
import { LogController, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { onConnectionClose } from './connectionClose.ts'

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

/**
 * Anything shaped like one of the product's API keys (gateway/src/keys/apiKeyFormat.ts): `aas_`
 * and 16+ base62 characters, in any case (`AAS_<key body>` would leave only the prefix to guess).
 */
const KEY_LIKE = /aas_[0-9a-z]{16}/i

/**
 * A key's 32 random characters are the whole credential without the prefix (its checksum is
 * computed from them), so any run of 32+ base62 characters counts as key material, unless it is
 * hex only: trace ids (W3C, 32 hex digits) and digests are, a key's body almost never (22⁄62 per
 * character, 32 times).
 */
const LONG_RUN = /[0-9A-Za-z]{32,}/g
const HEX_ONLY = /^[0-9A-Fa-f]+$/

function carriesKeyMaterial(id: string): boolean {
  if (KEY_LIKE.test(id)) return true
  for (const [run] of id.matchAll(LONG_RUN)) if (!HEX_ONLY.test(run)) return true
  return false
}

/**
 * Reuses a well-formed `X-Request-Id` from the caller (the gateway) so one id follows a request,
 * unless it may hold an API key, with or without its prefix: a client that sends its key there
 * gets a fresh id, and the key reaches no log line and no upstream.
 */
export function requestIdFrom(request: { headers: Record<string, string | string[] | undefined> }): string {
  const incoming = request.headers['x-request-id']
  return typeof incoming === 'string' && REQUEST_ID.test(incoming) && !carriesKeyMaterial(incoming) ? incoming : randomUUID()
}

/** Turns off Fastify's two lines per request; `requestContext` writes one instead. */
export function singleLineRequestLogging(): LogController {
  return new LogController({ disableRequestLogging: true, requestIdLogLabel: 'requestId' })
}

/** The status logged and counted (nginx's) for a request whose client left before any answer. */
export const CLIENT_CLOSED_REQUEST = 499

const LOGGED = Symbol('access line written')
const COUNTED = Symbol('request counted')
const REFUSED_WITH = Symbol('status the HTTP parser refused the request with')
const NOT_CARRIED_OUT = Symbol('status of a request refused because its answer could never be sent')
const CLOSED_WITH_CONNECTION = Symbol('close follows the connection while the answer is queued')
type Accountable = {
  [LOGGED]?: true
  [COUNTED]?: true
  [REFUSED_WITH]?: number
  [NOT_CARRIED_OUT]?: number
  [CLOSED_WITH_CONNECTION]?: true
}

/** What an answer is accounted for by: its access line (requestContext) or its count (httpMetrics). */
export type Accounting = typeof LOGGED | typeof COUNTED
export const ACCESS_LINE: Accounting = LOGGED
export const REQUEST_COUNT: Accounting = COUNTED

/**
 * Marks an answer whose access line or count has been recorded: Fastify ran onResponse for it.
 * A property, not `writableFinished`: an injected request (light-my-request) never reads as
 * finished, and would be recorded twice.
 */
export function markAccounted(response: object, accounting: Accounting): void {
  ;(response as Accountable)[accounting] = true
}

/**
 * Marks the answer of a request the HTTP parser refused mid-body (a broken chunk, a body that
 * never came whole): the refusal has its own line, and the request is counted with its status.
 */
export function markRefusedByParser(response: object, status: number): void {
  ;(response as Accountable)[LOGGED] = true
  ;(response as Accountable)[REFUSED_WITH] = status
}

/**
 * Marks the answer of a request refused because the connection closes before its answer's turn
 * (RFC 9112 §9.6: a request pipelined behind an answer that closes it is not carried out): that
 * answer is never written, and the request is logged and counted with `status` when the
 * connection closes.
 */
export function markNotCarriedOut(response: object, status: number): void {
  ;(response as Accountable)[NOT_CARRIED_OUT] = status
}

/**
 * Node emits no 'close' for the answer of a pipelined request still queued behind another when the
 * connection closes (it only aborts the request): such an answer never ended, and its request had
 * no log line or count. The connection's close ends it instead. Only for a queued answer: one that
 * has the socket is told by Node. Ended once the connection's other close callbacks have run: one
 * registered after this one marks a request that still waited for the answers ahead not carried
 * out (ended at once, the first create waiting behind a list was logged 499, those behind it 400).
 */
function closeWithConnectionWhileQueued(reply: FastifyReply): void {
  const response = reply.raw
  const state = response as Accountable
  if (response.socket !== null || state[CLOSED_WITH_CONNECTION]) return
  state[CLOSED_WITH_CONNECTION] = true
  const forget = onConnectionClose(reply.request.raw.socket, () =>
    queueMicrotask(() => {
      if (response.socket === null && !response.writableFinished) response.emit('close')
    }),
  )
  response.once('close', forget)
}

/**
 * Calls `record` with a status and a message when an answer ends without Fastify's onResponse,
 * so the request would have no log line or no count: the client left before any answer (499: it
 * gave up on a slow upstream, or reset the connection right after sending), an answer already
 * under way was cut short (the upstream broke off, or the client left mid-body: the status it had
 * started with), the HTTP parser refused the request mid-body (its refusal's status), or the
 * request was not carried out as its answer could never be sent (markNotCarriedOut's status). An
 * answer still queued behind another ends with its connection. The plugin calling it marks its
 * answers in onResponse (markAccounted) with the same `accounting`.
 */
export function whenAnswerCutShort(reply: FastifyReply, accounting: Accounting, record: (status: number, message: string) => void): void {
  const response = reply.raw
  closeWithConnectionWhileQueued(reply)
  response.once('close', () => {
    const state = response as Accountable
    if (state[accounting] || response.writableFinished) return
    const refused = state[REFUSED_WITH]
    const notCarriedOut = state[NOT_CARRIED_OUT]
    if (refused !== undefined) record(refused, 'request refused by the HTTP parser')
    else if (notCarriedOut !== undefined) record(notCarriedOut, 'request not carried out: the connection closed before its answer')
    else if (response.headersSent) record(reply.statusCode, 'answer cut short')
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
      // Read while the connection is surely open: Node keeps a socket's peer address once read,
      // and has none to give a later stage (the gateway's X-Forwarded-For, after an await) for a
      // client that has left by then.
      void request.socket.remoteAddress
      reply.header('x-request-id', request.id)
      whenAnswerCutShort(reply, ACCESS_LINE, (status, message) => log(request, reply, status, message))
      done()
    })
    app.addHook('onResponse', (request, reply, done) => {
      markAccounted(reply.raw, ACCESS_LINE)
      log(request, reply, reply.statusCode, 'request completed')
      done()
    })
  },
  { name: 'request-context' },
)
