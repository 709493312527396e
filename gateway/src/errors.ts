import { defineErrorCodes } from '../../common/src/http/apiError.ts'
import type { ClientErrorCodes } from '../../common/src/http/clientErrors.ts'
import { MAX_HEADER_LINES } from '../../common/src/http/headerLines.ts'
import type { RetryAfterSpread } from '../../common/src/http/retryAfter.ts'
import type { FrameworkErrorCodes } from '../../common/src/http/errorHandler.ts'

/**
 * Every code the gateway itself answers with. Answers from the pets-service (validation_failed,
 * pet_not_found, …) pass through unchanged; the README lists both sets.
 */
export const gatewayErrors = defineErrorCodes({
  bad_request: { status: 400, message: 'The request could not be understood.' },
  missing_api_key: { status: 401, message: 'Send your API key as "Authorization: Bearer <key>".' },
  invalid_api_key: { status: 401, message: 'The API key is not valid.' },
  not_found: { status: 404, message: 'No route matches this path.' },
  method_not_allowed: { status: 405, message: 'This path does not answer this method; the Allow header lists the ones it does.' },
  request_timeout: { status: 408, message: 'The request was not received in time.' },
  payload_too_large: { status: 413, message: 'The request body is larger than 1 MiB.' },
  uri_too_long: { status: 414, message: 'The request target (path and query) is longer than 16 KiB.' },
  unsupported_media_type: { status: 415, message: 'The Content-Type header is not a valid media type.' },
  headers_too_large: { status: 431, message: 'The request line and headers together are larger than 16 KiB.' },
  rate_limited: { status: 429, message: 'Too many requests; retry after the time in Retry-After.' },
  api_key_banned: {
    status: 429,
    message: 'This API key is temporarily banned for sending requests while rate limited; retry after the time in Retry-After.',
  },
  internal_error: { status: 500, message: 'Something went wrong on our side.' },
  not_implemented: { status: 501, message: 'This operation is not available yet.' },
  bad_gateway: { status: 502, message: 'The catalogue service could not be reached or answered badly.' },
  service_unavailable: { status: 503, message: 'The service is temporarily unavailable; retry shortly.' },
  upstream_timeout: { status: 504, message: 'The catalogue service did not answer in time.' },
  http_version_not_supported: { status: 505, message: 'This server speaks HTTP/1.1 (and HTTP/1.0) only; send the request as HTTP/1.1.' },
})

/** The Retry-After of the 503 for a key Postgres could not be asked about: around 5 s, drawn on each answer. */
export const RETRY_AFTER_UNAVAILABLE: RetryAfterSpread = { min: 3, max: 7 }

const methodNotSupported = () => gatewayErrors.create('not_implemented', 'This method is not supported.')

export const gatewayFrameworkErrors: FrameworkErrorCodes = {
  validation: (message) => gatewayErrors.create('bad_request', message),
  invalidJson: (message) => gatewayErrors.create('bad_request', message),
  notFound: () => gatewayErrors.create('not_found'),
  methodNotAllowed: (allow) => gatewayErrors.create('method_not_allowed', undefined, { headers: { allow } }),
  // Under /v1/pets every method the router knows is forwarded; only the pets-service knows the rest.
  unknownMethod: methodNotSupported,
  payloadTooLarge: () => gatewayErrors.create('payload_too_large'),
  // A Content-Type that does not parse (`bogus`, `a, b`) on a route of the gateway's own that reads a
  // body (none but the 400 of an undecodable path); under /v1/pets it goes on to the upstream (upstreamProxy.ts).
  unsupportedMediaType: () => gatewayErrors.create('unsupported_media_type'),
  badRequest: () => gatewayErrors.create('bad_request'),
  serverError: (error) => gatewayErrors.create('internal_error', undefined, { cause: error }),
}

/** More header lines than the gateway reads (headerLines.ts): refused, not cut short. */
export const tooManyHeaderLines = () =>
  gatewayErrors.create('headers_too_large', `The request has more than ${MAX_HEADER_LINES.toLocaleString('en-US')} header lines.`)

export const gatewayClientErrors: ClientErrorCodes = {
  badRequest: () => gatewayErrors.create('bad_request'),
  headersTooLarge: () => gatewayErrors.create('headers_too_large'),
  uriTooLong: () => gatewayErrors.create('uri_too_long'),
  requestTimeout: () => gatewayErrors.create('request_timeout'),
  // A method Node's parser does not know, and CONNECT: the gateway is not a forward proxy.
  methodNotImplemented: methodNotSupported,
}
