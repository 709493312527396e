/**
 * Bad arguments: the message and a pointer to --help go to stderr, exit code 2. The whole usage
 * only with `withUsage`, for a command line that names no command at all.
 */
export class UsageError extends Error {
  override name = 'UsageError'
  readonly withUsage: boolean

  constructor(message: string, withUsage = false) {
    super(message)
    this.withUsage = withUsage
  }
}

/** The command could not be done (unknown key id, no database, ...): the message goes to stderr, exit code 1. */
export class CliError extends Error {
  override name = 'CliError'
}

/** An error's message and its causes', one line, for errors that are not bugs (no stack trace). */
export function explain(error: unknown): string {
  const parts: string[] = []
  for (let current: unknown = error; current !== undefined && parts.length < 5; ) {
    if (current instanceof AggregateError && !current.message) {
      parts.push(...current.errors.map((inner: unknown) => (inner instanceof Error ? inner.message : String(inner))))
    } else {
      parts.push(current instanceof Error ? current.message : String(current))
    }
    current = current instanceof Error ? current.cause : undefined
  }
  return [...new Set(parts.filter(Boolean))].join(': ')
}
