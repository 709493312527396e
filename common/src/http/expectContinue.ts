import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { noRouteTakesTheBody } from './errorHandler.ts'

/** Node's test for the expectation it leaves to 'checkContinue' (_http_server.js continueExpression). */
const CONTINUE_EXPECTATION = /(?:^|\W)100-continue(?:$|\W)/i

/**
 * Whether an Expect field holds 100-continue as Node reads it: anywhere in the list (RFC 9110
 * §10.1.1; repeated fields come joined), `100-continue, foo` too. Node then waits for the
 * service to send the 100, and closes the connection after a final answer sent without it.
 */
export function expectsContinue(expectation: string): boolean {
  return CONTINUE_EXPECTATION.test(expectation)
}

/**
 * `Expect: 100-continue` (RFC 9110 §10.1.1) answered when the body is about to be read, not when
 * the request arrives. Node's default sends 100 Continue to every such request before any hook
 * runs, so a client with no valid key, over its limit, announcing a body over the limit, or sending
 * it to a path no route takes, was told to upload the body and only then refused. Now a request
 * that is refused before its body is wanted gets its final answer at once, and the client never
 * sends the body. Other expectations are ignored.
 */
export const expectContinue = fp(
  async (app: FastifyInstance, options: { bodyLimitBytes: number }) => {
    // With a listener, Node leaves the 100 to the application and hands the request on as usual.
    app.server.on('checkContinue', (request, response) => app.server.emit('request', request, response))
    // Any other expectation is ignored, which RFC 9110 §10.1.1 allows (417 is a MAY): Node's own
    // 417 had no Error body and skipped authentication and the per-IP limit.
    app.server.on('checkExpectation', (request, response) => app.server.emit('request', request, response))
    app.addHook('preParsing', (request, reply, payload, done) => {
      const expectation = request.headers.expect
      // An HTTP/1.0 client knows no 1xx answers: it would take the 100 for the final answer, so its
      // expectation is ignored (RFC 9110 §10.1.1: a server MUST ignore it from HTTP/1.0).
      if (expectation !== undefined && expectsContinue(expectation) && request.raw.httpVersionMinor >= 1) {
        // No route takes it: its path's 404 or 405 now (errorBodies), not after a body no one reads.
        if (request.is404) return done(noRouteTakesTheBody())
        // A GET or HEAD body is neither read nor forwarded: not asked for. Node closes the
        // connection after the final answer, the body the client held back unsent.
        const bodyRead = request.method !== 'GET' && request.method !== 'HEAD'
        if (bodyRead && !(Number(request.headers['content-length']) > options.bodyLimitBytes)) reply.raw.writeContinue()
      }
      done(null, payload)
    })
  },
  { name: 'expect-continue' },
)
