/**
 * Page cursors are opaque to clients: base64url of a versioned payload holding the last id
 * served. Keyset paging on the primary key means rows added during a walk never shift the
 * pages, so no row that existed when the walk began is skipped or served twice.
 */
const VERSION = 'p1'

export function encodeCursor(lastId: number): string {
  return Buffer.from(`${VERSION}:${lastId}`, 'utf8').toString('base64url')
}

/** The id after which the next page starts, or undefined when the cursor is not one of ours. */
export function decodeCursor(cursor: string): number | undefined {
  if (!/^[A-Za-z0-9_-]+$/.test(cursor)) return undefined
  const match = /^p1:([1-9][0-9]{0,15})$/.exec(Buffer.from(cursor, 'base64url').toString('utf8'))
  if (!match) return undefined
  const id = Number(match[1])
  return Number.isSafeInteger(id) ? id : undefined
}
