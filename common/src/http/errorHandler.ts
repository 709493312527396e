import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest, HTTPMethods } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from './apiError.ts'

/** Answers with the Error body, its status and headers (the body as Fastify would serialise it). */
export function sendApiError(reply: FastifyReply, apiError: ApiError): void {
  void reply.code(apiError.status).headers(apiError.headers).type('application/json; charset=utf-8').send(apiError.toJson())
}

/**
 * How a hook refuses a request. A deliberate answer (an ApiError with nothing behind it: a 401, a
 * 429) is sent from the hook: Fastify's error path (its onError hooks, the handler lookup, the
 * mapping in toApiError) has nothing to add to it, and a refusal is answered many times a second
 * by design. An error with a cause (a 503 because a dependency failed) takes that path, to the
 * error handler's log line.
 */
export function refuseFromHook(reply: FastifyReply, done: (error?: Error) => void, apiError: ApiError): void {
  if (apiError.cause === undefined) sendApiError(reply, apiError)
  else done(apiError)
}

/** The codes every service answers with for framework-level failures. */
export interface FrameworkErrorCodes {
  validation: (message: string) => ApiError
  invalidJson: (message: string) => ApiError
  notFound: () => ApiError
  /** A path that exists, asked with a method it does not answer; `allow` lists the ones it does. */
  methodNotAllowed: (allow: string) => ApiError
  /**
   * A method the router does not know at all (RFC 9110 §15.6.2: 501). A service whose routes
   * forward whole prefixes cannot tell which methods such a path answers, so it says this instead;
   * without it, the service answers from its own routes like any other method.
   */
  unknownMethod?: () => ApiError
  payloadTooLarge: () => ApiError
  unsupportedMediaType: () => ApiError
  /** Anything else the client sent wrong that has no specific code (bad URL encoding …): 400. */
  badRequest: () => ApiError
  /** Maps an unexpected error to a 5xx; the default is `internal_error`. */
  serverError: (error: unknown) => ApiError
}

// Fastify's own error codes, mapped once to the services' documented codes.
const CONTENT_ERRORS: Record<string, keyof FrameworkErrorCodes> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'payloadTooLarge',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupportedMediaType',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalidJson',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalidJson',
  FST_ERR_CTP_INVALID_JSON_BODY: 'invalidJson',
}

function isFastifyError(error: unknown): error is FastifyError {
  return typeof error === 'object' && error !== null && 'message' in error
}

export function toApiError(error: unknown, codes: FrameworkErrorCodes): ApiError {
  if (error instanceof ApiError) return error
  if (!isFastifyError(error)) return codes.serverError(error)
  if (error.validation) return codes.validation(error.message)
  const mapped = error.code ? CONTENT_ERRORS[error.code] : undefined
  if (mapped === 'payloadTooLarge') return codes.payloadTooLarge()
  if (mapped === 'unsupportedMediaType') return codes.unsupportedMediaType()
  if (mapped === 'invalidJson') return codes.invalidJson('The request body is not valid JSON.')
  // JSON.parse and secure-json-parse (prototype poisoning) throw SyntaxError with statusCode 400.
  if (error instanceof SyntaxError && error.statusCode === 400) {
    return codes.invalidJson('The request body is not valid JSON.')
  }
  const status = error.statusCode
  if (status !== undefined && status >= 400 && status < 500) return codes.badRequest()
  return codes.serverError(error)
}

/**
 * For Fastify's `frameworkErrors` option: failures it detects before routing (a URL that is not
 * valid percent-encoding, an unusable Content-Type) take the same Error body as everything else.
 */
export function frameworkErrorHandler(codes: FrameworkErrorCodes) {
  return (error: FastifyError, _request: FastifyRequest, reply: FastifyReply) => {
    sendApiError(reply, toApiError(error, codes))
  }
}

/**
 * The methods some route answers on this URL's path. RFC 9110 §15.5.6: a path that exists but
 * not for the method asked is a 405 with these in `Allow`, not a 404 that says the path is gone.
 */
function methodsAnswering(app: FastifyInstance, url: string): string[] {
  return app.supportedMethods.filter((method) => answers(app.findRoute({ method: method as HTTPMethods, url }))).sort()
}

/**
 * A match with an empty named parameter is not a route for this path ("/pets/" matches
 * "/pets/:petId" with petId ""; the route answers it 404), so it must not put GET into `Allow`.
 */
function answers(match: { params: Record<string, string | undefined> } | null): boolean {
  return match !== null && Object.entries(match.params).every(([name, value]) => name === '*' || value !== '')
}

/**
 * A Content-Type sent that does not parse as a media type: Fastify would answer 415 for the body.
 * A request no route takes (is404) gets its path's 404 or 405 instead (errorBodies).
 */
export function hasNoMediaType(request: FastifyRequest): boolean {
  return request.headers['content-type'] !== undefined && request.mediaType === undefined
}

function notFoundAnswer(app: FastifyInstance, request: FastifyRequest, codes: FrameworkErrorCodes): ApiError {
  if (codes.unknownMethod && !app.supportedMethods.includes(request.method)) return codes.unknownMethod()
  const allowed = methodsAnswering(app, request.url)
  return allowed.length > 0 ? codes.methodNotAllowed(allowed.join(', ')) : codes.notFound()
}

const NO_ROUTE_TAKES_THE_BODY = 'AAS_NO_ROUTE_TAKES_THE_BODY'

/**
 * The refusal of a body announced with `Expect: 100-continue` to a request no route takes, before
 * the body is asked for (expectContinue): answered with its path's 404 or 405.
 */
export function noRouteTakesTheBody(): Error {
  return Object.assign(new Error('no route takes this request\'s body'), { code: NO_ROUTE_TAKES_THE_BODY })
}

/**
 * One error handler and one not-found handler: everything thrown becomes the spec's Error
 * body, and 5xx details stay in the log, never in the response.
 */
export const errorBodies = fp(
  async (
    app: FastifyInstance,
    options: {
      codes: FrameworkErrorCodes
      /**
       * True when the failure behind a 5xx is said elsewhere, once for all the requests it fails
       * (a Postgres refusal, once per episode): no error line for each of them.
       */
      reported?: (cause: unknown) => boolean
    },
  ) => {
    const { codes, reported } = options
    app.setErrorHandler((error, request, reply) => {
      // Fastify refuses a Content-Type that is no media type at all (`bogus`, `a, b`) with 415 as it
      // starts to read the body, before any handler, the not-found one's too. No route takes such a
      // request, so its body is no one's to judge: the path's answer (404, or 405 with Allow) is
      // given instead, after every earlier stage (a key, the limits) let the request through. Here,
      // not in a hook, so that no other request pays for it.
      const code = (error as { code?: unknown }).code
      if (request.is404 && (code === NO_ROUTE_TAKES_THE_BODY || (code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE' && hasNoMediaType(request)))) {
        return sendApiError(reply, notFoundAnswer(app, request, codes))
      }
      const apiError = toApiError(error, codes)
      // A 5xx with something behind it (an exception, an upstream or database failure) is an
      // error line for the operator. A deliberate one (501 for a route not built yet, 503 while
      // shutting down) is an answer like any other: the access line records it, and an error line
      // for each would page someone for nothing.
      if (apiError.status >= 500 && apiError.cause !== undefined && !reported?.(apiError.cause)) {
        request.log.error({ err: error, code: apiError.code }, 'request failed')
      }
      sendApiError(reply, apiError)
    })
    app.setNotFoundHandler((request, reply) => {
      sendApiError(reply, notFoundAnswer(app, request, codes))
    })
  },
  { name: 'error-bodies' },
)
