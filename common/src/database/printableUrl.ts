/** Query parameters pg reads a secret from (pg-connection-string): a URL may carry its password there. */
const SECRET_PARAMETERS = ['password', 'sslpassword']

/** Parameters pg and pg-connection-string read that hold no secret: their values are printed. */
const KNOWN_PARAMETERS = new Set([
  'host', 'port', 'user', 'db', 'dbname', 'database', 'application_name', 'fallback_application_name', 'options',
  'connect_timeout', 'keepalives', 'keepalives_idle', 'ssl', 'sslmode', 'sslcert', 'sslkey', 'sslrootcert', 'sslnegotiation',
  'uselibpqcompat', 'client_encoding', 'encoding', 'statement_timeout', 'query_timeout', 'lock_timeout',
  'idle_in_transaction_session_timeout', 'target_session_attrs', 'replication', ...SECRET_PARAMETERS,
])

/**
 * A database URL fit to print: the password hidden wherever pg would read one (the userinfo, a
 * `?password=` parameter, the `socket:` form's query); one that does not parse is not printed at all.
 * A socket folder (`/var/run/postgresql`, or `/var/run/postgresql pets` with its database) is
 * printed as pg reads it, its first two words: they hold no secret, and pg reads nothing else.
 */
export function printableUrl(url: string): string {
  if (url.startsWith('/')) return url.split(' ').slice(0, 2).join(' ')
  try {
    const parsed = new URL(url)
    if (hasUnencodedAt(url)) return "(a URL with an '@' after its host: not printed)"
    parsed.hash = ''
    if (parsed.password) parsed.password = '***'
    for (const name of SECRET_PARAMETERS) if (parsed.searchParams.has(name)) parsed.searchParams.set(name, '***')
    // A parameter pg has no use for may be a password's rest (`u:p@ss?w=rd@db`): its value hidden.
    for (const name of new Set(parsed.searchParams.keys())) if (!KNOWN_PARAMETERS.has(name)) parsed.searchParams.set(name, '***')
    return parsed.toString()
  } catch {
    return '(an unparsable URL)'
  }
}

/**
 * Whether a URL holds an `@` past its authority that no parameter's value explains: a password
 * with `/`, `?` or `#` left unencoded (`postgres://u:p@ss/w@rd@db/x`). Parsed, its rest is the
 * host (`ss`) and the path, so part of the password was printed as both and looked up in DNS.
 * Any `@` in the path or the fragment counts; in the query, one in a parameter before its `=`
 * (`?w@rd@db/x`), not in a value (`?application_name=me@host`). A database name with `@` counts
 * too: pg does not decode `%40` in it, so it is given as PGDATABASE instead.
 */
export function hasUnencodedAt(url: string): boolean {
  const start = url.indexOf('//')
  if (start < 0) return false
  const rest = url.slice(start + 2)
  const end = rest.search(/[/?#]/)
  if (end < 0) return false
  const tail = rest.slice(end)
  const queryAt = tail.indexOf('?')
  const fragmentAt = tail.indexOf('#')
  const pathEnd = Math.min(queryAt < 0 ? tail.length : queryAt, fragmentAt < 0 ? tail.length : fragmentAt)
  if (tail.slice(0, pathEnd).includes('@')) return true
  if (fragmentAt >= 0 && tail.slice(fragmentAt).includes('@')) return true
  if (queryAt < 0 || queryAt > pathEnd) return false
  const query = tail.slice(queryAt + 1, fragmentAt > queryAt ? fragmentAt : tail.length)
  return query.split('&').some((parameter) => {
    const at = parameter.indexOf('@')
    return at >= 0 && !parameter.slice(0, at).includes('=')
  })
}
