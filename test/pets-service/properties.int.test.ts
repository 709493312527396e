import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { jsonPost, startPetsService } from '../helpers/petsService.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

const ERROR_BODY = { code: expect.any(String), message: expect.any(String) }

describe('pets-service under random input', () => {
  const database = suiteDatabase()
  const service = suiteService(() => startPetsService(database.url))

  const field = fc.oneof(
    fc.string({ maxLength: 120 }),
    fc.string({ unit: 'binary', maxLength: 30 }),
    fc.integer(),
    fc.double(),
    fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }).map((n) => n.toString()),
    fc.constantFrom('available', 'pending', 'sold', null, true, [], {}),
  )
  const plausiblePet = fc.record(
    {
      name: fc.oneof(fc.string({ minLength: 1, maxLength: 110 }), fc.string({ unit: 'grapheme', maxLength: 40 })),
      categoryId: fc.oneof(fc.integer({ min: 1 }), fc.maxSafeNat(), fc.integer()),
      status: fc.constantFrom('available', 'pending', 'sold'),
    },
    { requiredKeys: ['name', 'categoryId'] },
  )
  const body = fc.oneof(
    plausiblePet.map((value) => JSON.stringify(value)),
    fc.record(
      { name: field, categoryId: field, status: field, id: field, extra: field },
      { requiredKeys: [] },
    ).map((value) => JSON.stringify(value)),
    fc.json(),
    fc.string({ unit: 'binary', maxLength: 60 }),
  )

  it('never answers a random POST body with a 5xx, and every 201 equals what a later GET returns', async () => {
    let created = 0
    await fc.assert(
      fc.asyncProperty(body, async (payload) => {
        const response = await service.request('/pets', jsonPost(payload))
        const answer = (await response.json()) as Record<string, unknown>
        expect(response.status).toBeLessThan(500)
        if (response.status !== 201) {
          expect(answer).toMatchObject({ ...ERROR_BODY, status: response.status })
          return
        }
        created++
        const fetched = await service.request(`/pets/${String(answer.id)}`)
        expect(fetched.status).toBe(200)
        expect(await fetched.json()).toEqual(answer)
      }),
      { numRuns: 150 },
    )
    // The property only means something if some random bodies were valid pets.
    expect(created).toBeGreaterThan(10)
  })

  it('never answers random query strings or pet ids with a 5xx', async () => {
    const queryValue = fc.oneof(
      fc.string({ maxLength: 40 }),
      fc.integer().map(String),
      fc.constantFrom('available', 'sold', '1e3', '0x10', '', '%', '%00', '[]'),
    )
    const query = fc
      .array(fc.tuple(fc.constantFrom('limit', 'status', 'cursor', 'other'), queryValue), { maxLength: 4 })
      .map((pairs) => pairs.map(([key, value]) => `${key}=${encodeURIComponent(value)}`).join('&'))
    const petId = fc.oneof(fc.string({ maxLength: 30 }).map(encodeURIComponent), fc.bigInt().map(String))
    await fc.assert(
      fc.asyncProperty(query, petId, async (queryString, id) => {
        const list = await service.request(`/pets?${queryString}`)
        expect(list.status === 200 || list.status === 400).toBe(true)
        if (list.status === 400) expect(await list.json()).toMatchObject({ ...ERROR_BODY, status: 400 })
        else expect(Array.isArray(await list.json())).toBe(true)
        const one = await service.request(`/pets/${id}`)
        expect([200, 400, 404]).toContain(one.status)
        expect(await one.json()).toBeTypeOf('object')
      }),
      { numRuns: 150 },
    )
  })
})
