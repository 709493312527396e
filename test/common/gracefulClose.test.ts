import Fastify, { type FastifyInstance } from 'fastify'
import { setTimeout as sleep } from 'node:timers/promises'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { ApiError } from '../../common/src/http/apiError.ts'
import { coalescedWrites } from '../../common/src/http/coalescedWrites.ts'
import { gracefulClose } from '../../common/src/http/gracefulClose.ts'
import { openRaw } from '../helpers/rawClient.ts'

let app: FastifyInstance | undefined

afterEach(async () => {
  await app?.close()
  app = undefined
})

/** A service with a route that answers only when released, and one that records that it ran. */
async function serve() {
  const ran: string[] = []
  let release = () => undefined as void
  const released = new Promise<void>((resolve) => (release = resolve))
  app = Fastify()
  await app.register(gracefulClose, { unavailable: () => new ApiError('service_unavailable', 503, 'Shutting down.') })
  app.get('/slow', async () => {
    ran.push('slow')
    await released
    return { slow: true }
  })
  app.post('/create', async () => {
    ran.push('create')
    return { created: true }
  })
  await app.register(coalescedWrites)
  const url = await app.listen({ port: 0, host: '127.0.0.1' })
  return { url, ran, release }
}

const PIPELINED = 'GET /slow HTTP/1.1\r\nHost: test\r\n\r\nPOST /create HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n'

describe('requests pipelined on one connection while the service drains', () => {
  it('answers both in order when not draining', async () => {
    const { url, ran, release } = await serve()
    const connection = await openRaw(url)
    connection.socket.write(PIPELINED)
    await vi.waitFor(() => expect(ran).toEqual(['slow', 'create']))
    release()
    await vi.waitFor(() => expect(connection.answer()).toContain('{"created":true}'))
    expect(connection.answer().indexOf('{"slow":true}')).toBeLessThan(connection.answer().indexOf('{"created":true}'))
    connection.socket.destroy()
  })

  // The answer ahead says Connection: close, and the connection closes after it: an answer behind
  // it is never sent, so the request must not be carried out either (RFC 9112 §9.6), or a create
  // would store a pet its client is never told about.
  it('does not carry out a request queued behind an answer that will close the connection', async () => {
    const { url, ran, release } = await serve()
    void app!.drain(60_000)
    const connection = await openRaw(url)
    connection.socket.write(PIPELINED)
    await vi.waitFor(() => expect(ran).toContain('slow'))
    await sleep(200)
    release()
    await connection.closed
    expect(connection.answer()).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*connection: close\r\n[\s\S]*\{"slow":true\}$/i)
    expect(ran).toEqual(['slow'])
  })

  /**
   * A connection whose first answer (GET /stream) is under way with keep-alive when the drain
   * begins; `finish` ends it. /next and /create record that they ran.
   */
  async function streamingThenDraining() {
    const ran: string[] = []
    let finish = () => undefined as void
    app = Fastify()
    await app.register(gracefulClose, { unavailable: () => new ApiError('service_unavailable', 503, 'Shutting down.') })
    app.get('/stream', (_request, reply) => {
      ran.push('stream')
      reply.hijack()
      reply.raw.writeHead(200, { 'content-type': 'text/plain', 'transfer-encoding': 'chunked' })
      reply.raw.write('part one\n')
      finish = () => reply.raw.end('part two\n')
    })
    app.get('/next', async () => {
      ran.push('next')
      return { next: true }
    })
    app.post('/create', async () => {
      ran.push('create')
      return { created: true }
    })
    await app.register(coalescedWrites)
    const connection = await openRaw(await app.listen({ port: 0, host: '127.0.0.1' }))
    connection.socket.write('GET /stream HTTP/1.1\r\nHost: test\r\n\r\n')
    await vi.waitFor(() => expect(connection.answer()).toContain('part one'))
    expect(connection.answer()).toMatch(/keep-alive/i)
    void app.drain(60_000)
    return { ran, connection, finish: () => finish() }
  }

  it('serves a request queued behind an answer already under way with keep-alive, begun before the drain', async () => {
    const { ran, connection, finish } = await streamingThenDraining()
    connection.socket.write('GET /next HTTP/1.1\r\nHost: test\r\n\r\n')
    await vi.waitFor(() => expect(ran).toEqual(['stream', 'next']))
    finish()
    await connection.closed
    expect(connection.answer()).toMatch(/part two\n\r\n0\r\n\r\nHTTP\/1\.1 200 OK\r\n[\s\S]*connection: close\r\n[\s\S]*\{"next":true\}$/i)
  })

  it('does not carry out a request queued behind one let through during the drain, whose answer will say close', async () => {
    const { ran, connection, finish } = await streamingThenDraining()
    connection.socket.write('GET /next HTTP/1.1\r\nHost: test\r\n\r\nPOST /create HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n')
    await vi.waitFor(() => expect(ran).toContain('next'))
    await sleep(200)
    finish()
    await connection.closed
    expect(connection.answer()).toMatch(/\{"next":true\}$/)
    expect(ran).toEqual(['stream', 'next'])
  })
})

describe('a request whose body is still arriving when the service closes', () => {
  it('is answered 503 at once, not carried out, and the close does not wait for the rest of the body', async () => {
    const ran: string[] = []
    app = Fastify()
    await app.register(gracefulClose, { unavailable: () => new ApiError('service_unavailable', 503, 'Shutting down.') })
    app.post('/create', async () => {
      ran.push('create')
      return { created: true }
    })
    await app.register(coalescedWrites)
    const connection = await openRaw(await app.listen({ port: 0, host: '127.0.0.1' }))
    connection.socket.write('POST /create HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"name":')
    const slowBody = connection.dribble(' '.repeat(90), 100)
    await sleep(300)
    const closeStarted = performance.now()
    await app.close()
    app = undefined
    expect(performance.now() - closeStarted).toBeLessThan(2_000)
    await connection.closed
    await slowBody
    expect(connection.answer()).toMatch(/^HTTP\/1\.1 503 Service Unavailable\r\n[\s\S]*connection: close\r\n/i)
    expect(connection.answer()).toContain('"code":"service_unavailable"')
    expect(ran).toEqual([])
  })
})
