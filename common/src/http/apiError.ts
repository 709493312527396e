/**
 * The spec's Error body ({ code, message, status }) and a typed error that carries it.
 * Each service declares its closed set of codes once (see `defineErrorCodes`) so the
 * README, the OpenAPI document and the tests can be checked against one list.
 */
export interface ErrorBody {
  code: string
  message: string
  status: number
}

export interface ErrorCodeDefinition {
  status: number
  message: string
}

export interface ApiErrorOptions {
  headers?: Record<string, string>
  cause?: unknown
}

export class ApiError extends Error {
  readonly code: string
  readonly status: number
  readonly headers: Readonly<Record<string, string>>

  constructor(code: string, status: number, message: string, options: ApiErrorOptions = {}, json?: string) {
    // An ApiError is an answer, not a defect: capturing a stack trace for each 401 or 429 cost
    // more than the rest of the request (measured with --cpu-prof under load). Nor is a `cause`
    // option given when there is none: an own `cause` property made each one dearer to build.
    const stackTraceLimit = Error.stackTraceLimit
    Error.stackTraceLimit = 0
    if (options.cause === undefined) super(message)
    else super(message, { cause: options.cause })
    Error.stackTraceLimit = stackTraceLimit
    this.name = 'ApiError'
    this.code = code
    this.status = status
    this.headers = options.headers ?? {}
    this.#json = json
  }

  toBody(): ErrorBody {
    return { code: this.code, message: this.message, status: this.status }
  }

  #json: string | undefined

  /** The body as sent; serialised once per error, and once per code for a code's own message. */
  toJson(): string {
    return (this.#json ??= JSON.stringify(this.toBody()))
  }
}

export type ErrorCatalogue<Code extends string> = Readonly<Record<Code, ErrorCodeDefinition>> & {
  /** Builds the error for `code`, with a more specific message when one helps the client. */
  create(code: Code, message?: string, options?: ApiErrorOptions): ApiError
  codes(): Code[]
}

export function defineErrorCodes<Code extends string>(
  definitions: Record<Code, ErrorCodeDefinition>,
): ErrorCatalogue<Code> {
  const frozen = Object.freeze({ ...definitions })
  const codes = Object.keys(frozen) as Code[]
  // A refusal with its code's own message (a 429, a ban) is answered many times a second: its body
  // is the same each time, serialised here once.
  const defaultBodies = new Map<string, string>()
  for (const code of codes) {
    const { status, message } = frozen[code]
    defaultBodies.set(code, JSON.stringify({ code, message, status } satisfies ErrorBody))
  }
  return Object.freeze({
    ...frozen,
    create(code: Code, message?: string, options?: ApiErrorOptions) {
      const definition = frozen[code]
      if (message === undefined) return new ApiError(code, definition.status, definition.message, options, defaultBodies.get(code))
      return new ApiError(code, definition.status, message, options)
    },
    codes: () => [...codes],
  })
}
