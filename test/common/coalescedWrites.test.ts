import Fastify, { type FastifyInstance } from 'fastify'
import { Readable } from 'node:stream'
import { afterEach, describe, expect, it } from 'vitest'
import { coalescedWrites } from '../../common/src/http/coalescedWrites.ts'

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
