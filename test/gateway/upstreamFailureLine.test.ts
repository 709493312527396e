import { pino } from 'pino'
import { describe, expect, it } from 'vitest'
import { withoutFrames } from '../../gateway/src/proxy/upstreamProxy.ts'
import { captureLog } from '../helpers/logCapture.ts'

describe("an upstream failure as the gateway's warn line gives it", () => {
  const logged = (error: unknown) => {
    const log = captureLog()
    pino({ serializers: { err: pino.stdSerializers.err } }, log.stream).warn({ err: withoutFrames(error) }, 'upstream request failed')
    return log.entries()[0]!.err as Record<string, unknown>
  }
  const refused = (address: string) => Object.assign(new Error(`connect ECONNREFUSED ${address}:3001`), { code: 'ECONNREFUSED', address, port: 3001 })

  it('keeps its type, message, code and cause, without stack frames', () => {
    const error = Object.assign(new TypeError('fetch failed', { cause: refused('127.0.0.1') }), { code: 'UND_ERR' })
    const err = logged(error)
    expect(err).toMatchObject({ type: 'TypeError', code: 'UND_ERR', message: 'fetch failed: connect ECONNREFUSED 127.0.0.1:3001' })
    expect(JSON.stringify(err)).not.toMatch(/\\n\s+at /)
  })

  // A host with an IPv6 and an IPv4 address: Node tries both, and the error's message is empty.
  it('lists each address tried of an AggregateError', () => {
    const error = Object.assign(new AggregateError([refused('::1'), refused('127.0.0.1')], ''), { code: 'ECONNREFUSED' })
    const err = logged(error)
    expect(err).toMatchObject({ type: 'AggregateError', code: 'ECONNREFUSED' })
    expect((err.aggregateErrors as { message: string }[]).map((each) => each.message)).toEqual(['connect ECONNREFUSED ::1:3001', 'connect ECONNREFUSED 127.0.0.1:3001'])
    expect(JSON.stringify(err)).not.toMatch(/\\n\s+at /)
  })
})
