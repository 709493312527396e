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

export class ApiError extends Error {
  readonly code: string
  readonly status: number
  readonly headers: Readonly<Record<string, string>>

  constructor(
    code: string,
    status: number,
    message: string,
    options: { headers?: Record<string, string>; cause?: unknown } = {},
  ) {
    // An ApiError is an answer, not a defect: capturing a stack trace for each 401 or 429 cost
    // more than the rest of the request (measured with --cpu-prof under load).
    const stackTraceLimit = Error.stackTraceLimit
    Error.stackTraceLimit = 0
    super(message, { cause: options.cause })
    Error.stackTraceLimit = stackTraceLimit
    this.name = 'ApiError'
    this.code = code
    this.status = status
    this.headers = options.headers ?? {}
  }

  toBody(): ErrorBody {
    return { code: this.code, message: this.message, status: this.status }
  }

  #json: string | undefined

  /** The body as sent; an answer given many times (a shared refusal) is serialised once. */
  toJson(): string {
    return (this.#json ??= JSON.stringify(this.toBody()))
  }
}

export type ErrorCatalogue<Code extends string> = Readonly<Record<Code, ErrorCodeDefinition>> & {
  /** Builds the error for `code`, with a more specific message when one helps the client. */
  create(code: Code, message?: string, options?: { headers?: Record<string, string>; cause?: unknown }): ApiError
  codes(): Code[]
}

export function defineErrorCodes<Code extends string>(
  definitions: Record<Code, ErrorCodeDefinition>,
): ErrorCatalogue<Code> {
  const frozen = Object.freeze({ ...definitions })
  const codes = Object.keys(frozen) as Code[]
  return Object.freeze({
    ...frozen,
    create(code: Code, message?: string, options?: { headers?: Record<string, string>; cause?: unknown }) {
      const definition = frozen[code]
      return new ApiError(code, definition.status, message ?? definition.message, options)
    },
    codes: () => [...codes],
  })
}
