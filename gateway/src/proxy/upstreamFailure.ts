import { gatewayErrors } from '../errors.ts'

/*
 * How an upstream exchange fails, as metrics count it (timeout, connect, protocol, saturated) and as
 * clients see it (504 upstream_timeout, 502 bad_gateway), and which error answers pass through:
 * only the Error body every service answers with.
 */

export const UPSTREAM_FAILURE_KINDS = ['timeout', 'connect', 'protocol', 'saturated'] as const
export type UpstreamFailureKind = (typeof UPSTREAM_FAILURE_KINDS)[number]

const CONNECT_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'ENOTFOUND', 'EHOSTUNREACH'])

export function failureKind(error: unknown): UpstreamFailureKind {
  const codes = errorCodes(error)
  if (codes.some((code) => TIMEOUT_CODES.has(code))) return 'timeout'
  if (codes.some((code) => CONNECT_CODES.has(code))) return 'connect'
  return 'protocol'
}

const TIMEOUT_CODES = new Set([
  'FST_REPLY_FROM_TIMEOUT',
  'FST_REPLY_FROM_GATEWAY_TIMEOUT',
  'FST_REPLY_FROM_HTTP_REQUEST_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
  'UND_ERR_CONNECT_TIMEOUT',
])

function errorCodes(error: unknown): string[] {
  const codes: string[] = []
  for (let current = error as { code?: unknown; cause?: unknown } | undefined; current; current = current.cause as typeof current) {
    if (typeof current.code === 'string') codes.push(current.code)
    if (codes.length > 5) break
  }
  return codes
}

/**
 * Upstream failures as clients see them: 504 when it stayed silent, 502 for everything else. The
 * messages name the catalogue (the pets upstream) or, for another upstream, its name.
 */
export function upstreamFailure(error: unknown, upstream = 'pets', sentBefore = false) {
  const service = upstream === 'pets' ? undefined : `The ${upstream} service`
  if (failureKind(error) === 'timeout') return gatewayErrors.create('upstream_timeout', service && `${service} did not answer in time.`, { cause: error })
  // A connection refused: the request was never sent, and the upstream is most likely restarting
  // (a lone pets-service is listening again a second or so after its drain ends). Not when this
  // was its resend: the first attempt reached the upstream, and a create may have been stored.
  const refused = !sentBefore && errorCodes(error).includes('ECONNREFUSED')
  return gatewayErrors.create('bad_gateway', service && `${service} could not be reached or answered badly.`, {
    cause: error,
    ...(refused ? { headers: { 'retry-after': '1' } } : {}),
  })
}

/** The answer's body was not complete within the upstream timeout of its headers. */
export class UpstreamDeadlineError extends Error {
  readonly code = 'UND_ERR_BODY_TIMEOUT'
  constructor(timeoutMillis: number) {
    super(`the upstream's answer was not complete within ${timeoutMillis} ms of its headers`)
  }
}

/** No answer head within the upstream timeout of the request. */
export class UpstreamSilentError extends Error {
  readonly code = 'UND_ERR_HEADERS_TIMEOUT'
  constructor(timeoutMillis: number) {
    super(`the upstream sent no answer within ${timeoutMillis} ms`)
  }
}

export const isJson = (contentType: string | string[] | undefined) => typeof contentType === 'string' && /^application\/json\b/i.test(contentType)

/** Exactly `{code, message, status}` with the answer's own status, as every service answers an error. */
export function isErrorBody(body: Buffer, statusCode: number): boolean {
  try {
    const error = JSON.parse(body.toString('utf8')) as Record<string, unknown> | null
    return (
      typeof error === 'object' &&
      error !== null &&
      Object.keys(error).length === 3 &&
      typeof error.code === 'string' &&
      typeof error.message === 'string' &&
      error.status === statusCode
    )
  } catch {
    return false
  }
}
