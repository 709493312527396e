import { describe, expect, it } from 'vitest'
import { panicMessage } from '../../common/src/database/embeddedPostgres.ts'

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

describe('the PANIC npm start watches the embedded database for', () => {
  it('is found among the other messages of one write, with its message', () => {
    const data = Buffer.concat([
      message('C', Buffer.from('UPDATE 1\0')),
      errorResponse('PANIC', 'could not write to file "pg_wal/xlogtemp.42": No space left on device'),
      message('Z', Buffer.from('I')),
    ])
    expect(panicMessage(data)).toBe('could not write to file "pg_wal/xlogtemp.42": No space left on device')
  })

  it('is not an ERROR or FATAL, nor a message cut short', () => {
    expect(panicMessage(errorResponse('ERROR', 'could not extend file "base/5/16397": No space left on device'))).toBeUndefined()
    expect(panicMessage(errorResponse('FATAL', 'terminating connection'))).toBeUndefined()
    expect(panicMessage(errorResponse('PANIC', 'cut').subarray(0, 12))).toBeUndefined()
  })
})
