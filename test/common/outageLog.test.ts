import net from 'node:net'
import pg from 'pg'
import { pino } from 'pino'
import { describe, expect, it, vi } from 'vitest'
import { reportPostgresOutages } from '../../common/src/database/outageLog.ts'
import { captureLog } from '../helpers/logCapture.ts'

/** What pg gives a query while Postgres refuses connections: a port nothing listens on. */
async function refusedConnectionError(): Promise<Error> {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise((resolve) => server.close(resolve))
  const client = new pg.Client({ host: '127.0.0.1', port, user: 'nobody', database: 'none' })
  return client.connect().then(
    () => {
      throw new Error(`something listens on ${port}`)
    },
    (error: Error) => error,
  )
}

describe('requests answered 503 while Postgres is unavailable', () => {
  it('are said at once, then in one error line an interval with how many, with no line for a quiet interval', async () => {
    const log = captureLog()
    const report = reportPostgresOutages(pino(log.stream), 'pets-service', 200)
    const refused = await refusedConnectionError()
    const lines = () => log.entries().map((entry) => ({ level: entry.level, msg: entry.msg, requests: entry.requests, code: (entry.err as { code?: string }).code }))
    const line = (requests: number) => ({
      level: 50,
      msg: 'Postgres unavailable to the pets-service: requests answered 503',
      requests,
      code: 'ECONNREFUSED',
    })

    for (let i = 0; i < 5; i++) expect(report(refused)).toBe(true)
    expect(lines()).toEqual([line(1)])
    await vi.waitFor(() => expect(lines()).toEqual([line(1), line(4)]), { timeout: 2_000, interval: 20 })
    // An interval without one: no line, and the next is said at once.
    await new Promise((resolve) => setTimeout(resolve, 500))
    expect(lines()).toHaveLength(2)
    expect(report(refused)).toBe(true)
    expect(lines()).toEqual([line(1), line(4), line(1)])
  })

  it('says a new cause at once, though another was said within the interval', async () => {
    const log = captureLog()
    const report = reportPostgresOutages(pino(log.stream), 'pets-service', 60_000)
    const terminated = Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' })
    for (const error of [terminated, terminated, await refusedConnectionError(), terminated, await refusedConnectionError()]) expect(report(error)).toBe(true)
    const said = log.entries().map((entry) => [(entry.err as { code?: string }).code, entry.requests])
    // Refusals on two ports are one cause: numbers aside.
    expect(said).toEqual([['57P01', 1], ['ECONNREFUSED', 1]])
  })

  it('leaves any other failure to its request\'s own error line', () => {
    const log = captureLog()
    const report = reportPostgresOutages(pino(log.stream), 'gateway', 200)
    expect(report(Object.assign(new Error('column "nme" does not exist'), { code: '42703' }))).toBe(false)
    expect(report(new TypeError('Cannot read properties of undefined'))).toBe(false)
    expect(log.lines).toEqual([])
  })
})
