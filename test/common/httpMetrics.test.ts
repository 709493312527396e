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
})
