import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { decodeCursor, encodeCursor } from '../../pets-service/src/http/cursor.ts'

describe('page cursors', () => {
  it('decode to the id they were made from, for every id a pet can have', () => {
    fc.assert(fc.property(fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }), (id) => {
      expect(decodeCursor(encodeCursor(id))).toBe(id)
    }))
  })

  it('are opaque URL-safe text', () => {
    expect(encodeCursor(42)).toMatch(/^[A-Za-z0-9_-]+$/)
    expect(encodeCursor(42)).not.toContain('42')
  })

  it.each([
    ['garbage', 'not a cursor!'],
    ['base64 of something else', Buffer.from('hello').toString('base64url')],
    ['an id of zero', Buffer.from('p1:0').toString('base64url')],
    ['an id above 2^53 - 1', Buffer.from('p1:9007199254740993').toString('base64url')],
    ['another version', Buffer.from('p2:5').toString('base64url')],
  ])('refuse %s', (_case, cursor) => {
    expect(decodeCursor(cursor)).toBeUndefined()
  })
})
