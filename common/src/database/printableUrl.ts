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
    if (parsed.password) parsed.password = '***'
    for (const name of SECRET_PARAMETERS) if (parsed.searchParams.has(name)) parsed.searchParams.set(name, '***')
    return parsed.toString()
  } catch {
    return '(an unparsable URL)'
  }
}
