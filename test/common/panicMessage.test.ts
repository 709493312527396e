import { describe, expect, it } from 'vitest'
import { panicWatcher } from '../../common/src/database/embeddedPostgres.ts'

/** A protocol message: its type byte, its length (itself included), its body. */
function message(type: string, body: Buffer): Buffer {
  const length = Buffer.alloc(4)
  length.writeInt32BE(body.length + 4)
  return Buffer.concat([Buffer.from(type), length, body])
}

function errorResponse(severity: string, text: string): Buffer {
  const fields = [`S${severity}`, `V${severity}`, 'C53100', `M${text}`].map((field) => Buffer.from(`${field}\0`))
  return message('E', Buffer.concat([...fields, Buffer.from('\0')]))
}

/** What a watcher makes of `data` written in pieces of `size` bytes: the PANIC's message, once whole. */
function watched(data: Buffer, size = data.length): (string | undefined)[] {
  const watch = panicWatcher()
  const seen: (string | undefined)[] = []
  for (let at = 0; at < data.length; at += size) seen.push(watch(data.subarray(at, at + size)))
  return seen.filter((found) => found !== undefined)
}

describe('the PANIC npm start watches the embedded database for', () => {
  it('is found among the other messages of one write, with its message', () => {
    const data = Buffer.concat([
      message('C', Buffer.from('UPDATE 1\0')),
      errorResponse('PANIC', 'could not write to file "pg_wal/xlogtemp.42": No space left on device'),
      message('Z', Buffer.from('I')),
    ])
    expect(watched(data)).toEqual(['could not write to file "pg_wal/xlogtemp.42": No space left on device'])
  })

  it('is found however PGlite cut what it wrote into pieces, after rows too', () => {
    const rows = Array.from({ length: 50 }, (_, index) => message('D', Buffer.from(`row ${index}`)))
    const data = Buffer.concat([...rows, errorResponse('PANIC', 'could not write to file "pg_wal/xlogtemp.42": No space left on device')])
    for (const size of [1, 2, 3, 5, 7, 64, 100]) {
      expect(watched(data, size), `pieces of ${size} bytes`).toEqual(['could not write to file "pg_wal/xlogtemp.42": No space left on device'])
    }
  })

  it('is not an ERROR or FATAL, nor a message cut short', () => {
    expect(watched(errorResponse('ERROR', 'could not extend file "base/5/16397": No space left on device'))).toEqual([])
    expect(watched(errorResponse('FATAL', 'terminating connection'))).toEqual([])
    expect(watched(errorResponse('PANIC', 'cut').subarray(0, 12))).toEqual([])
  })
})
