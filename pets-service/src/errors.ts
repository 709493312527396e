import { defineErrorCodes } from '../../common/src/http/apiError.ts'
import type { ClientErrorCodes } from '../../common/src/http/clientErrors.ts'
import type { FrameworkErrorCodes } from '../../common/src/http/errorHandler.ts'
import { isDatabaseUnavailable } from '../../common/src/database/pool.ts'
import { spreadRetryAfterSeconds, type RetryAfterSpread } from '../../common/src/http/retryAfter.ts'

/** Every code the pets-service answers with. The README's table is tested against this list. */
export const petsErrors = defineErrorCodes({
  validation_failed: { status: 400, message: 'The request is invalid.' },
  invalid_json: { status: 400, message: 'The request body is not valid JSON.' },
  bad_request: { status: 400, message: 'The request could not be understood.' },
  unauthorized: { status: 401, message: 'This service only answers the gateway.' },
  not_found: { status: 404, message: 'No route matches this path.' },
  pet_not_found: { status: 404, message: 'No animal has this id.' },
  method_not_allowed: { status: 405, message: 'This path does not answer this method; the Allow header lists the ones it does.' },
  request_timeout: { status: 408, message: 'The request was not received in time.' },
  payload_too_large: { status: 413, message: 'The request body is larger than 1 MiB.' },
  uri_too_long: { status: 414, message: 'The request target (path and query) is too long.' },
  unsupported_media_type: { status: 415, message: 'The request body must be application/json.' },
  headers_too_large: { status: 431, message: 'The request line and headers together are too large.' },
  idempotency_key_reused: {
    status: 422,
    message: 'This Idempotency-Key was already used with a different request body.',
  },
  internal_error: { status: 500, message: 'Something went wrong on our side.' },
  service_unavailable: { status: 503, message: 'The catalogue is temporarily unavailable; retry shortly.' },
})

/** Seconds a client should wait after a 503 before retrying: around 5, drawn on each answer. */
export const RETRY_AFTER_UNAVAILABLE: RetryAfterSpread = { min: 3, max: 7 }

export const petsFrameworkErrors: FrameworkErrorCodes = {
  validation: (message) => petsErrors.create('validation_failed', message),
  invalidJson: (message) => petsErrors.create('invalid_json', message),
  notFound: () => petsErrors.create('not_found'),
  methodNotAllowed: (allow) => petsErrors.create('method_not_allowed', undefined, { headers: { allow } }),
  payloadTooLarge: () => petsErrors.create('payload_too_large'),
  unsupportedMediaType: () => petsErrors.create('unsupported_media_type'),
  badRequest: () => petsErrors.create('bad_request'),
  serverError: (error) =>
    isDatabaseUnavailable(error)
      ? petsErrors.create('service_unavailable', undefined, {
          headers: { 'retry-after': String(spreadRetryAfterSeconds(RETRY_AFTER_UNAVAILABLE)) },
          cause: error,
        })
      : petsErrors.create('internal_error', undefined, { cause: error }),
}

export const petsClientErrors: ClientErrorCodes = {
  badRequest: () => petsErrors.create('bad_request'),
  headersTooLarge: () => petsErrors.create('headers_too_large'),
  uriTooLong: () => petsErrors.create('uri_too_long'),
  requestTimeout: () => petsErrors.create('request_timeout'),
}
