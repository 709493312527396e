import Fastify, { type FastifyInstance } from 'fastify'
import { Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import { afterEach, describe, expect, it } from 'vitest'
import { ApiError } from '../../common/src/http/apiError.ts'
import { coalescedWrites } from '../../common/src/http/coalescedWrites.ts'
import { gracefulClose } from '../../common/src/http/gracefulClose.ts'
import { openRaw } from '../helpers/rawClient.ts'

let app: FastifyInstance | undefined

afterEach(async () => {
  await app?.close()
  app = undefined
})

async function serve(build: (app: FastifyInstance) => void): Promise<string> {
  app = Fastify()
  app.addHook('onSend', (_request, reply, payload, done) => {
    reply.header('x-earlier-hook', 'ran')
    done(null, payload)
  })
  build(app)
  await app.register(coalescedWrites)
  return app.listen({ port: 0, host: '127.0.0.1' })
}

describe('answers written at the end of their event-loop turn', () => {
  it('holds an answer until the turn ends, then writes it with the headers earlier hooks set', async () => {
    const written: boolean[] = []
    const url = await serve((app) =>
      app.get('/', (_request, reply) => {
        reply.send({ ok: true })
        written.push(reply.raw.headersSent)
        setImmediate(() => written.push(reply.raw.headersSent))
        return reply
      }),
    )
    const response = await fetch(url)
    expect(response.status).toBe(200)
    expect(response.headers.get('x-earlier-hook')).toBe('ran')
    expect(await response.json()).toEqual({ ok: true })
    expect(written).toEqual([false, true])
  })

  it('answers every one of many concurrent requests, whatever phase of the turn sent it', async () => {
    const url = await serve((app) => {
      app.get('/now/:n', async (request) => ({ n: Number((request.params as { n: string }).n) }))
      app.get('/immediate/:n', (request, reply) => {
        setImmediate(() => reply.send({ n: Number((request.params as { n: string }).n) }))
        return reply
      })
      app.get('/stream', (_request, reply) => reply.type('text/plain').send(Readable.from(['a', 'b', 'c'])))
    })
    const answers = await Promise.all(
      Array.from({ length: 60 }, async (_, n) => {
        const response = await fetch(`${url}/${n % 2 === 0 ? 'now' : 'immediate'}/${n}`)
        return ((await response.json()) as { n: number }).n
      }),
    )
    expect(answers).toEqual(Array.from({ length: 60 }, (_, n) => n))
    expect(await (await fetch(`${url}/stream`)).text()).toBe('abc')
  })

  it('answers 500 instead of hanging when the held answer cannot be written', async () => {
    const url = await serve((app) =>
      app.get('/', (_request, reply) => {
        reply.header('x-broken', 'line\nbreak').send('never')
        return reply
      }),
    )
    const response = await fetch(url, { signal: AbortSignal.timeout(5_000) })
    expect(response.status).toBe(500)
  })
})

describe('closing the server while answers are held', () => {
  it('sends the held answer, closes its connection and finishes closing at once', async () => {
    let started = 0
    let closedAfter: number | undefined
    app = Fastify()
    await app.register(gracefulClose, { unavailable: () => new ApiError('service_unavailable', 503, 'Shutting down.') })
    app.get('/', (_request, reply) => {
      reply.send({ ok: true })
      // What SIGTERM does when it is read in the same turn as this request.
      void app!.drain(0).then(() => app!.close()).then(() => (closedAfter = performance.now() - started))
      return reply
    })
    await app.register(coalescedWrites)
    const url = await app.listen({ port: 0, host: '127.0.0.1' })
    started = performance.now()
    const connection = await openRaw(url)
    connection.socket.write('GET / HTTP/1.1\r\nHost: test\r\n\r\n')
    const closedByServerAfter = await Promise.race([connection.closed, sleep(3_000).then(() => undefined)])
    connection.socket.destroy()
    expect(connection.answer()).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\n\{"ok":true\}$/)
    expect(closedByServerAfter).toBeDefined()
    expect(closedAfter).toBeLessThan(1_000)
    app = undefined
  })
})
