import Fastify from 'fastify'
import { Registry } from 'prom-client'
import { describe, expect, it } from 'vitest'
import { httpMetrics } from '../../common/src/ops/httpMetrics.ts'

describe('the request metrics a client can reach', () => {
  it('count methods an API is not asked with under "other", so cycling through them adds no series', async () => {
    const registry = new Registry()
    const app = Fastify()
    await app.register(httpMetrics, { registry })
    app.get('/pets', async () => [])
    for (const method of ['GET', 'DELETE', 'PROPFIND', 'MKCOL', 'PURGE', 'SEARCH']) await app.inject({ method: method as 'GET', url: '/pets' })
    const methods = (await registry.getSingleMetric('http_requests_total')!.get()).values.map((value) => value.labels.method)
    expect(methods.sort()).toEqual(['DELETE', 'GET', 'other'])
    await app.close()
  })

  it('count 5xx answers by status, so a 501 a client causes is told from a 502, and nothing else', async () => {
    const registry = new Registry()
    const app = Fastify()
    await app.register(httpMetrics, { registry })
    app.get('/orders', async (_request, reply) => reply.code(501).send({ code: 'not_implemented' }))
    app.get('/pets', async (_request, reply) => reply.code(502).send({ code: 'bad_gateway' }))
    app.get('/ok', async () => [])
    for (const url of ['/orders', '/orders', '/orders', '/pets', '/ok', '/missing']) await app.inject({ method: 'GET', url })
    const counted = (await registry.getSingleMetric('http_server_error_responses_total')!.get()).values
    expect(Object.fromEntries(counted.map((value) => [value.labels.status, value.value]))).toEqual({ 500: 0, 501: 3, 502: 1, 503: 0, 504: 0 })
    await app.close()
  })
})
