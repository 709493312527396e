/** A database URL fit to print: the password, if any, is hidden; one that does not parse is not printed at all. */
export function printableUrl(url: string): string {
  try {
    const parsed = new URL(url)
    if (parsed.password) parsed.password = '***'
    return parsed.toString()
  } catch {
    return '(an unparsable URL)'
  }
}
