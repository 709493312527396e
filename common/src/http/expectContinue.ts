import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/**
 * `Expect: 100-continue` (RFC 9110 §10.1.1) answered when the body is about to be read, not when
 * the request arrives. Node's default sends 100 Continue to every such request before any hook
 * runs, so a client with no valid key, over its limit, or announcing a body over the limit was
 * told to upload the body and only then refused. Now a request that is refused before its body is
 * wanted gets its final answer at once, and the client never sends the body. Other expectations
 * are ignored.
 */
/** Whether an Expect field, a list (RFC 9110 §10.1.1; repeated fields come joined), holds 100-continue. */
function expectsContinue(expectation: string): boolean {
  for (const part of expectation.split(',')) {
    if (part.trim().toLowerCase() === '100-continue') return true
  }
  return false
}

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
      if (
        expectation !== undefined &&
        expectsContinue(expectation) &&
        request.raw.httpVersionMinor >= 1 &&
        !(Number(request.headers['content-length']) > options.bodyLimitBytes)
      ) {
        reply.raw.writeContinue()
      }
      done(null, payload)
    })
  },
  { name: 'expect-continue' },
)
