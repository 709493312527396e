import createClient from 'openapi-fetch'
import { beforeAll, describe, expect, it } from 'vitest'
import type { paths } from '../../gateway/openapi/schema.ts'
import { contractFetch } from '../helpers/contract.ts'
import { startGateway } from '../helpers/gateway.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/**
 * End to end as an integrator works: the types generated from the document
 * (gateway/openapi/schema.ts) and an openapi-fetch client, through the gateway to the real
 * pets-service and Postgres. Every answer also passes the contract check.
 */
describe('a typed openapi-fetch client, generated from the document', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: pets.url }))
  let client: ReturnType<typeof createClient<paths>>

  beforeAll(async () => {
    const { key } = await gateway.createKey()
    client = createClient<paths>({ baseUrl: `${gateway.url}/v1`, fetch: contractFetch, headers: { authorization: `Bearer ${key}` } })
  })

  it('creates, lists and fetches pets', async () => {
    const created = await client.POST('/pets', {
      body: { name: 'Rex', categoryId: 2 },
      params: { header: { 'Idempotency-Key': 'typed-client-rex' } },
    })
    expect(created.response.status).toBe(201)
    const rex = created.data!
    expect(rex).toEqual({ id: expect.any(Number), name: 'Rex', categoryId: 2, status: 'available' })
    expect(created.response.headers.get('location')).toBe(`/v1/pets/${rex.id}`)

    const retried = await client.POST('/pets', {
      body: { name: 'Rex', categoryId: 2 },
      params: { header: { 'Idempotency-Key': 'typed-client-rex' } },
    })
    expect(retried.data).toEqual(rex)
    expect(retried.response.headers.get('idempotent-replayed')).toBe('true')

    await client.POST('/pets', { body: { name: 'Mia', categoryId: 3, status: 'pending' } })
    const listed = await client.GET('/pets', { params: { query: { status: 'available' } } })
    expect(listed.data?.map((pet) => pet.name)).toEqual(['Rex'])

    const fetched = await client.GET('/pets/{petId}', { params: { path: { petId: rex.id } } })
    expect(fetched.data).toEqual(rex)
    expect(fetched.response.headers.get('sunset')).toBe('Thu, 05 Dec 2030 00:00:00 GMT')
  })

  it('walks the catalogue page by page through the cursor of the Link header', async () => {
    for (let i = 0; i < 5; i++) await client.POST('/pets', { body: { name: `page-${i}`, categoryId: 1 } })
    const seen: number[] = []
    let cursor: string | undefined
    for (let page = 0; page < 20; page++) {
      const { data, response } = await client.GET('/pets', { params: { query: { limit: 2, ...(cursor ? { cursor } : {}) } } })
      seen.push(...data!.map((pet) => pet.id))
      const next = /^<([^>]+)>; rel="next"$/.exec(response.headers.get('link') ?? '')?.[1]
      if (!next) break
      cursor = new URL(next, gateway.url).searchParams.get('cursor') ?? undefined
    }
    expect(seen.length).toBeGreaterThanOrEqual(5)
    expect(new Set(seen).size).toBe(seen.length)
    expect([...seen].sort((a, b) => a - b)).toEqual(seen)
  })

  it('gets typed Error bodies', async () => {
    const missing = await client.GET('/pets/{petId}', { params: { path: { petId: 987_654_321 } } })
    expect(missing.response.status).toBe(404)
    expect(missing.error).toEqual({ code: 'pet_not_found', message: expect.any(String), status: 404 })

    const invalid = await client.POST('/pets', { body: { name: 'No category' } as { name: string; categoryId: number } })
    expect(invalid.error?.code).toBe('validation_failed')

    const anonymous = createClient<paths>({ baseUrl: `${gateway.url}/v1`, fetch: contractFetch })
    const refused = await anonymous.GET('/pets')
    expect(refused.error?.code).toBe('missing_api_key')
    const orders = await client.GET('/store/orders')
    expect(orders.error?.code).toBe('not_implemented')
  })

  it('reads the document itself without a key', async () => {
    const anonymous = createClient<paths>({ baseUrl: `${gateway.url}/v1`, fetch: contractFetch })
    const { data } = await anonymous.GET('/openapi.json')
    expect(data?.openapi).toMatch(/^3\.1\./)
  })
})
