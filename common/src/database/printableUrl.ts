/** Query parameters pg reads a secret from (pg-connection-string): a URL may carry its password there. */
const SECRET_PARAMETERS = ['password', 'sslpassword']

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
    return parsed.toString()
  } catch {
    return '(an unparsable URL)'
  }
}

/**
 * Whether a URL holds an `@` past its authority, before any `=`: a password with `/`, `?` or `#`
 * left unencoded (`postgres://u:p@ss/w@rd@db/x`). Parsed, its rest is the host (`ss`) and the
 * path, so part of the password was printed as both and looked up in DNS. A parameter's value
 * with an `@` (`?sslcert=/a@b.pem`) comes after its `=`.
 */
export function hasUnencodedAt(url: string): boolean {
  const start = url.indexOf('//')
  if (start < 0) return false
  const rest = url.slice(start + 2)
  const end = rest.search(/[/?#]/)
  if (end < 0) return false
  const tail = rest.slice(end)
  const at = tail.indexOf('@')
  return at >= 0 && !tail.slice(0, at).includes('=')
}
