import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
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
 * Requests the gateway will not pass on as they stand, refused with 400 and the Error body once
 * they have been charged like any other (RFC 9112): an HTTP/1.1 request without Host (§3.2),
 * two Host fields (§3.2), two Authorization fields, which one server would read as the first
 * key and another as the second, or two Content-Type fields (one server's JSON, another's text).
 * An HTTP/1.0 request framed with Transfer-Encoding is answered, then its connection closed
 * (§6.1: its framing cannot be trusted); so is one asking to upgrade.
 */
export const requestFraming = fp(
  async (app: FastifyInstance) => {
    app.addHook('onRequest', (request, reply, done) => {
      const raw = request.raw
      if (raw.httpVersion === '1.0' && raw.headers['transfer-encoding'] !== undefined) reply.header('connection', 'close')
      // The gateway upgrades to nothing and answers as HTTP/1.1 (RFC 9110 §7.8), but Node's parser
      // stops reading the connection after such a request: one pipelined behind it would wait
      // unanswered. Closing after the answer tells the client to send it again.
      if (raw.headers.upgrade !== undefined) reply.header('connection', 'close')
      if (raw.httpVersion === '1.1' && raw.headers.host === undefined) {
        return done(gatewayErrors.create('bad_request', 'An HTTP/1.1 request needs a Host header.'))
      }
      const repeated = repeatedSingleton(raw.rawHeaders)
      if (repeated !== undefined) return done(gatewayErrors.create('bad_request', `The ${repeated} header may be sent only once.`))
      done()
    })
  },
  { name: 'request-framing' },
)
