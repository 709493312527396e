import { gzipSync } from 'node:zlib'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { expectErrorResponse } from '../helpers/assertions.ts'
import { createPetRepository } from '../../pets-service/src/repository/petRepository.ts'
import { jsonPost, startPetsService, type RunningPetsService } from '../helpers/petsService.ts'

export interface CatalogueDatabase {
  url: string
  drop(): Promise<void>
}

type Pet = { id: number; name: string; categoryId: number; status: string }

/**
 * Every row of the spec's tables for listPets, createPet and getPet, and every DESIGN decision,
 * through real HTTP against a real Postgres. Run once on a Postgres server and once on the
 * embedded PGlite path.
 */
export function describeCatalogue(label: string, openDatabase: () => Promise<CatalogueDatabase>) {
  describe(`pets-service catalogue on ${label}`, () => {
    let database: CatalogueDatabase
    let service: RunningPetsService

    beforeAll(async () => {
      database = await openDatabase()
      service = await startPetsService(database.url)
    })
    afterAll(async () => {
      await service?.close()
      await database?.drop()
    })
    beforeEach(async () => {
      await service.pool.query('TRUNCATE pets.pets RESTART IDENTITY CASCADE')
    })

    async function createPet(body: Record<string, unknown>, headers: Record<string, string> = {}): Promise<Pet> {
      const response = await service.request('/pets', jsonPost(body, headers))
      expect(response.status, await response.clone().text()).toBe(201)
      return (await response.json()) as Pet
    }

    async function seed(count: number, status = 'available'): Promise<Pet[]> {
      const pets: Pet[] = []
      for (let i = 1; i <= count; i++) pets.push(await createPet({ name: `pet ${i}`, categoryId: i, status }))
      return pets
    }

    async function storedCount(): Promise<number> {
      const { rows } = await service.pool.query<{ count: string }>('SELECT count(*) FROM pets.pets')
      return Number(rows[0]?.count)
    }

    describe('POST /pets', () => {
      it('answers 201 with the stored pet, its assigned id and a Location header', async () => {
        const response = await service.request('/pets', jsonPost({ name: 'Rex', categoryId: 3, status: 'pending' }))
        expect(response.status).toBe(201)
        expect(response.headers.get('content-type')).toMatch(/^application\/json/)
        const pet = (await response.json()) as Pet
        expect(pet).toEqual({ id: expect.any(Number), name: 'Rex', categoryId: 3, status: 'pending' })
        expect(response.headers.get('location')).toBe(`/pets/${pet.id}`)
      })

      it('prefixes Location with the public path the gateway forwards', async () => {
        const response = await service.request(
          '/pets',
          jsonPost({ name: 'Rex', categoryId: 3 }, { 'x-forwarded-prefix': '/v1' }),
        )
        const pet = (await response.json()) as Pet
        expect(response.headers.get('location')).toBe(`/v1/pets/${pet.id}`)
      })

      it('defaults status to available and trims the name', async () => {
        const pet = await createPet({ name: '  Bella \t', categoryId: 1 })
        expect(pet).toMatchObject({ name: 'Bella', status: 'available' })
        // Invisible characters at the ends too: "Bella\u200b" would list as a second Bella.
        expect(await createPet({ name: '\u200bBella\u2060\u00ad', categoryId: 1 })).toMatchObject({ name: 'Bella' })
      })

      it('accepts names whose joiners and marks make visible text: an emoji family, a Persian name with a zero-width non-joiner, a combining diaeresis, an emoji with its variation selector', async () => {
        for (const name of ['Rex \u{1F468}\u200d\u{1F469}\u200d\u{1F467}', 'می\u200cخواهم', 'Zoe\u0308', '\u{1F436}\ufe0f']) {
          expect(await createPet({ name, categoryId: 1 })).toMatchObject({ name })
        }
      })

      it('accepts a 100-character name and categoryId 2^53 - 1 exactly', async () => {
        const name = 'n'.repeat(100)
        const pet = await createPet({ name, categoryId: Number.MAX_SAFE_INTEGER })
        expect(pet).toMatchObject({ name, categoryId: 9007199254740991 })
        const stored = await service.pool.query('SELECT category_id::text AS c FROM pets.pets WHERE id = $1', [pet.id])
        expect(stored.rows[0].c).toBe('9007199254740991')
      })

      it.each([
        ['name missing', '{"categoryId":1}'],
        ['categoryId missing', '{"name":"Rex"}'],
        ['an empty name', '{"name":"","categoryId":1}'],
        ['a name of only spaces', '{"name":"   ","categoryId":1}'],
        ['a name of 101 characters', JSON.stringify({ name: 'n'.repeat(101), categoryId: 1 })],
        ['a name with a NUL character', '{"name":"Re\\u0000x","categoryId":1}'],
        ['a name with a line break inside', '{"name":"Re\\nx","categoryId":1}'],
        ['a name with a line separator inside (U+2028)', '{"name":"Rex\\u2028Max","categoryId":1}'],
        ['a name with a paragraph separator inside (U+2029)', '{"name":"Rex\\u2029Max","categoryId":1}'],
        ['a name with a C1 control character', '{"name":"Re\\u0085x","categoryId":1}'],
        ['a name of only C1 control characters', '{"name":" \\u0085\\u009b ","categoryId":1}'],
        ['a name with a lone surrogate', '{"name":"Re\\ud800x","categoryId":1}'],
        ['a name with a right-to-left override', '{"name":"\\u202eexe.txt","categoryId":1}'],
        ['a name with a bidirectional isolate', '{"name":"Rex \\u2067xeR\\u2069","categoryId":1}'],
        ['a name of only zero-width characters', '{"name":"\\u200b\\u200d\\u2060","categoryId":1}'],
        ['a name of only a variation selector', '{"name":"\\ufe0f","categoryId":1}'],
        ['a name of only Hangul fillers', '{"name":"\\u3164\\u3164","categoryId":1}'],
        ['a name of only a combining mark', '{"name":"\\u0301","categoryId":1}'],
        ['a name of only the blank braille pattern', '{"name":"\\u2800","categoryId":1}'],
        ['a name of only noncharacters and unassigned code points', '{"name":"\\uffff\\ufdd0\\u0378","categoryId":1}'],
        ['a name that is a number', '{"name":12,"categoryId":1}'],
        ['categoryId 0', '{"name":"Rex","categoryId":0}'],
        ['a negative categoryId', '{"name":"Rex","categoryId":-4}'],
        ['a fractional categoryId', '{"name":"Rex","categoryId":1.5}'],
        ['a fractional categoryId JSON.parse rounds to an integer', '{"name":"Rex","categoryId":9007199254740990.5}'],
        ['a categoryId of 1 plus 10^-16 (would round to 1)', '{"name":"Rex","categoryId":1.0000000000000001}'],
        // The rounding check once took time quadratic in such a run of zeros (about 16 s here).
        ['a categoryId of 1 plus 10^-100001', `{"name":"Rex","categoryId":1.${'0'.repeat(100_000)}1}`],
        ['categoryId as a string', '{"name":"Rex","categoryId":"7"}'],
        ['categoryId 2^53', '{"name":"Rex","categoryId":9007199254740992}'],
        ['categoryId 2^53 + 1 (would round)', '{"name":"Rex","categoryId":9007199254740993}'],
        ['categoryId beyond int64', '{"name":"Rex","categoryId":99999999999999999999999}'],
        ['an unknown status', '{"name":"Rex","categoryId":1,"status":"adopted"}'],
        ['a client-chosen id', '{"id":5,"name":"Rex","categoryId":1}'],
        ['an unknown field', '{"name":"Rex","categoryId":1,"colour":"brown"}'],
        ['an array body', '[{"name":"Rex","categoryId":1}]'],
        ['a null body', 'null'],
      ])('refuses %s with 400 validation_failed and stores nothing', async (_case, body) => {
        await expectErrorResponse(await service.request('/pets', jsonPost(body)), 400, 'validation_failed')
        expect(await storedCount()).toBe(0)
      })

      it.each([
        ['a client-chosen id', '/pets', jsonPost('{"id":5,"name":"Rex","categoryId":1}'), 'body must NOT have the property "id"'],
        ['an unknown field', '/pets', jsonPost('{"name":"Rex","categoryId":1,"colour":"brown"}'), 'body must NOT have the property "colour"'],
        ['an unknown query parameter', '/pets?colour=brown', {}, 'querystring must NOT have the property "colour"'],
        ['a query parameter on a create', '/pets?limit=5', jsonPost('{"name":"Rex","categoryId":1}'), 'querystring must NOT have the property "limit"'],
        ['a query parameter given twice on a create', '/pets?limit=5&limit=6', jsonPost('{"name":"Rex","categoryId":1}'), 'querystring must NOT have the property "limit"'],
        ['a query parameter given twice on a read', '/pets/1?status=sold&status=sold', {}, 'querystring must NOT have the property "status"'],
        // Valid JSON the parser refuses as prototype poisoning: "not valid JSON" was untrue.
        ['a __proto__ key', '/pets', jsonPost('{"name":"Rex","categoryId":1,"__proto__":{"admin":true}}'), 'body must NOT have a property "__proto__", nor a "constructor" holding "prototype"'],
        ['an escaped __proto__ key beside a rounded number', '/pets', jsonPost('{"name":"Rex","categoryId":1.0000000000000001,"\\u005f_proto__":{}}'), 'body must NOT have a property "__proto__", nor a "constructor" holding "prototype"'],
        ['a constructor holding prototype', '/pets', jsonPost('{"name":"Rex","categoryId":1,"constructor":{"prototype":{}}}'), 'body must NOT have a property "__proto__", nor a "constructor" holding "prototype"'],
        [
          'an unknown field with a long name',
          '/pets',
          jsonPost(`{"name":"Rex","categoryId":1,"${'x'.repeat(500)}":1}`),
          `body must NOT have the property "${'x'.repeat(40)}…"`,
        ],
        [
          'a fractional categoryId JSON.parse rounds to an integer',
          '/pets',
          jsonPost('{"name":"A","categoryId":9007199254740990.5}'),
          'body/categoryId must be an integer; 9007199254740990.5 would be rounded to one',
        ],
        [
          'a categoryId of 1 plus 10^-101, spaced out',
          '/pets',
          jsonPost(`{ "name" : "Rex" ,\n "categoryId" : 1.${'0'.repeat(100)}1 }`),
          `body/categoryId must be an integer; 1.${'0'.repeat(38)}… would be rounded to one`,
        ],
        // JSON.parse keeps the last of a member given twice: the refused value before it would pass.
        ['a categoryId given twice, first refused', '/pets', jsonPost('{"name":"A","categoryId":"x","categoryId":2}'), 'body/categoryId must be given once'],
        ['a status given twice', '/pets', jsonPost('{"name":"A","categoryId":2,"status":"bogus","status":"sold"}'), 'body/status must be given once'],
        ['a name given twice, spelt apart', '/pets', jsonPost('{"name":"A","categoryId":2,"n\\u0061me" : "B"}'), 'body/name must be given once'],
        [
          'a long field given twice',
          '/pets',
          jsonPost(`{"name":"A","categoryId":2,"${'x'.repeat(500)}":1,"${'x'.repeat(500)}":2}`),
          `body/${'x'.repeat(39)}… must be given once`,
        ],
        // Where the schema refuses the value for another reason, that reason is the message.
        ['a name that is a rounded number', '/pets', jsonPost('{"name":1.0000000000000001,"categoryId":1}'), 'body/name must be string'],
        [
          'a rounded number in an unknown field',
          '/pets',
          jsonPost('{"name":"Rex","categoryId":1,"colour":[1.0000000000000001]}'),
          'body must NOT have the property "colour"',
        ],
      ])('names the field in the message when refusing %s', async (_case, path, init, message) => {
        const response = await service.request(path, init)
        expect(response.status).toBe(400)
        expect(await response.json()).toEqual({ code: 'validation_failed', message, status: 400 })
      })

      it.each([
        ['an unknown status', '/pets', jsonPost('{"name":"Rex","categoryId":1,"status":"adopted"}'), 'body/status must be one of "available", "pending", "sold"'],
        ['an unknown status filter', '/pets?status=adopted', {}, 'querystring/status must be one of "available", "pending", "sold"'],
      ])('lists the allowed values in the message when refusing %s', async (_case, path, init, message) => {
        const response = await service.request(path, init)
        expect(response.status).toBe(400)
        expect(await response.json()).toEqual({ code: 'validation_failed', message, status: 400 })
      })

      it.each([
        ['malformed JSON', '{"name": "Rex",'],
        ['an empty body', ''],
        ['malformed JSON holding a rounded number', '{"name":"Rex","categoryId":1.0000000000000001,'],
        ['malformed JSON holding a __proto__ key', '{"name":"Rex","categoryId":1,"__proto__":{"admin":true}'],
      ])('refuses %s with 400 invalid_json and stores nothing', async (_case, body) => {
        await expectErrorResponse(await service.request('/pets', jsonPost(body)), 400, 'invalid_json')
        expect(await storedCount()).toBe(0)
      })

      it('refuses a body that is not UTF-8 with 400 invalid_json instead of storing a replacement character', async () => {
        const latin1 = Buffer.from('{"name":"Caf\xe9","categoryId":1}', 'latin1')
        const response = await service.request('/pets', { method: 'POST', headers: { 'content-type': 'application/json' }, body: latin1 })
        await expectErrorResponse(response, 400, 'invalid_json')
        expect(await storedCount()).toBe(0)
        const utf8 = await service.request('/pets', jsonPost('{"name":"Café","categoryId":1}'))
        expect(utf8.status).toBe(201)
        expect(((await utf8.json()) as { name: string }).name).toBe('Café')
      })

      it('refuses a body that is not application/json with 415', async () => {
        const response = await service.request('/pets', {
          method: 'POST',
          headers: { 'content-type': 'text/plain' },
          body: 'name=Rex',
        })
        await expectErrorResponse(response, 415, 'unsupported_media_type')
      })

      it.each([
        ['a gzip-compressed body', { 'content-encoding': 'gzip' }, gzipSync('{"name":"Rex","categoryId":1}')],
        ['a plain body labelled as brotli', { 'content-encoding': 'br' }, '{"name":"Rex","categoryId":1}'],
        ['a body that declares charset=latin1', { 'content-type': 'application/json; charset=latin1' }, Buffer.from('{"name":"Caf\xe9","categoryId":1}', 'latin1')],
        ['a body that declares charset=utf-16', { 'content-type': 'application/json; charset="utf-16"' }, '{"name":"Rex","categoryId":1}'],
        // Two media types, the first with its charset: the message said "charset=utf-8, is not supported".
        ['a body under two media types', { 'content-type': 'application/json; charset=utf-8, text/plain' }, '{"name":"Rex","categoryId":1}'],
      ])('refuses %s with 415 and stores nothing', async (_case, headers, body) => {
        const response = await service.request('/pets', { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body })
        const error = await expectErrorResponse(response, 415, 'unsupported_media_type')
        expect(error.message).not.toContain('utf-8,')
        // For a content coding, the codings it takes (RFC 9110 §15.5.16): none but identity.
        expect(response.headers.get('accept-encoding')).toBe('content-encoding' in headers ? 'identity' : null)
        expect(await storedCount()).toBe(0)
      })

      it('accepts a body that declares charset=UTF-8 or Content-Encoding: identity', async () => {
        const variants: Record<string, string>[] = [
          { 'content-type': 'application/json; charset=UTF-8' },
          { 'content-type': 'application/json', 'content-encoding': 'identity' },
        ]
        for (const headers of variants) {
          const response = await service.request('/pets', { method: 'POST', headers, body: '{"name":"Rex","categoryId":1}' })
          expect(response.status).toBe(201)
        }
        expect(await storedCount()).toBe(2)
      })

      it('refuses a body over 1 MiB with 413', async () => {
        const body = JSON.stringify({ name: 'Rex', categoryId: 1, pad: 'x'.repeat(1_048_576) })
        await expectErrorResponse(await service.request('/pets', jsonPost(body)), 413, 'payload_too_large')
        expect(await storedCount()).toBe(0)
      })

      describe('Idempotency-Key', () => {
        it('returns the first pet for a retried request and creates no second row', async () => {
          const headers = { 'idempotency-key': 'order-42' }
          const first = await service.request('/pets', jsonPost({ name: 'Rex', categoryId: 1 }, headers))
          const retry = await service.request('/pets', jsonPost({ name: ' Rex ', categoryId: 1 }, headers))
          expect(first.status).toBe(201)
          expect(retry.status).toBe(201)
          expect(await retry.json()).toEqual(await first.json())
          expect(retry.headers.get('idempotent-replayed')).toBe('true')
          expect(retry.headers.get('location')).toBe(first.headers.get('location'))
          expect(await storedCount()).toBe(1)
        })

        it.each([
          ['categoryId', { name: 'Rex', categoryId: 2 }],
          ['name', { name: 'Max', categoryId: 1 }],
          ['status', { name: 'Rex', categoryId: 1, status: 'sold' }],
        ])('answers 422 when the same key comes with a different body (%s)', async (_field, other) => {
          const headers = { 'idempotency-key': `order-43-${_field}` }
          await createPet({ name: 'Rex', categoryId: 1 }, headers)
          const response = await service.request('/pets', jsonPost(other, headers))
          await expectErrorResponse(response, 422, 'idempotency_key_reused')
          expect(await storedCount()).toBe(1)
        })

        it('creates exactly one pet when ten retries race', async () => {
          const headers = { 'idempotency-key': 'race-1' }
          const responses = await Promise.all(
            Array.from({ length: 10 }, () => service.request('/pets', jsonPost({ name: 'Rex', categoryId: 1 }, headers))),
          )
          const bodies = await Promise.all(responses.map((response) => response.json()))
          expect(responses.map((response) => response.status)).toEqual(Array(10).fill(201))
          expect(new Set(bodies.map((body) => (body as Pet).id)).size).toBe(1)
          expect(await storedCount()).toBe(1)
        })

        it('treats a key past its 24 h as new, even before the hourly purge has removed it', async () => {
          const headers = { 'idempotency-key': 'order-old' }
          const first = await createPet({ name: 'Rex', categoryId: 1 }, headers)
          await service.pool.query(`UPDATE pets.idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'order-old'`)
          const again = await service.request('/pets', jsonPost({ name: 'Rex', categoryId: 1 }, headers))
          expect(again.status).toBe(201)
          expect(again.headers.get('idempotent-replayed')).toBeNull()
          expect(((await again.json()) as Pet).id).not.toBe(first.id)
          // The key now names the new pet, for another 24 h.
          const retry = await service.request('/pets', jsonPost({ name: 'Rex', categoryId: 2 }, headers))
          await expectErrorResponse(retry, 422, 'idempotency_key_reused')
          expect(await storedCount()).toBe(2)
        })

        it('the purge (at start and hourly) removes keys past their 24 h, and a retry of 23 h still gets the first pet', async () => {
          const body = { name: 'Rex', categoryId: 1 }
          const recent = await createPet(body, { 'idempotency-key': 'order-23h' })
          await createPet(body, { 'idempotency-key': 'order-25h' })
          await service.pool.query(`UPDATE pets.idempotency_keys SET created_at = now() - interval '23 hours' WHERE key = 'order-23h'`)
          await service.pool.query(`UPDATE pets.idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'order-25h'`)
          expect(await createPetRepository(service.pool).purgeIdempotencyKeys()).toBe(1)
          const retry = await service.request('/pets', jsonPost(body, { 'idempotency-key': 'order-23h' }))
          expect(retry.status).toBe(201)
          expect(retry.headers.get('idempotent-replayed')).toBe('true')
          expect(((await retry.json()) as Pet).id).toBe(recent.id)
          expect(await storedCount()).toBe(2)
        })

        it('keeps keys of different consumers apart', async () => {
          const body = { name: 'Rex', categoryId: 1 }
          const a = await createPet(body, { 'idempotency-key': 'shared', 'x-consumer-id': 'key_a' })
          const b = await createPet(body, { 'idempotency-key': 'shared', 'x-consumer-id': 'key_b' })
          expect(a.id).not.toBe(b.id)
          expect(await storedCount()).toBe(2)
        })

        it.each([['a key with spaces', 'two words'], ['a key over 255 characters', 'k'.repeat(256)]])(
          'refuses %s with 400',
          async (_case, key) => {
            const response = await service.request('/pets', jsonPost({ name: 'Rex', categoryId: 1 }, { 'idempotency-key': key }))
            await expectErrorResponse(response, 400, 'validation_failed')
            expect(await storedCount()).toBe(0)
          },
        )
      })
    })

    describe('GET /pets', () => {
      it('answers a bare JSON array of pets in id order, 20 by default', async () => {
        const pets = await seed(25)
        const response = await service.request('/pets')
        expect(response.status).toBe(200)
        expect(response.headers.get('content-type')).toMatch(/^application\/json/)
        expect(await response.json()).toEqual(pets.slice(0, 20))
      })

      it('answers an empty array when the catalogue is empty, without a next link', async () => {
        const response = await service.request('/pets')
        expect(response.status).toBe(200)
        expect(await response.json()).toEqual([])
        expect(response.headers.get('link')).toBeNull()
      })

      it.each([1, 100])('honours limit=%i', async (limit) => {
        await seed(limit === 1 ? 3 : 101)
        const response = await service.request(`/pets?limit=${limit}`)
        expect(((await response.json()) as Pet[]).length).toBe(limit)
      })

      it('filters by status', async () => {
        await seed(2, 'available')
        const sold = await seed(3, 'sold')
        const response = await service.request('/pets?status=sold')
        expect(await response.json()).toEqual(sold)
      })

      it.each(['available', 'pending'])('answers ?status=%s with pets of that status only, none of a status that sorts after it', async (status) => {
        const asked = await seed(2, status)
        await seed(2, 'sold')
        await seed(1, status === 'available' ? 'pending' : 'available')
        const response = await service.request(`/pets?status=${status}`)
        expect(response.status).toBe(200)
        expect(await response.json()).toEqual(asked)
      })

      it.each([
        ['limit=0'],
        ['limit=101'],
        ['limit=abc'],
        ['limit=1.5'],
        ['limit=-1'],
        ['limit=1&limit=2'],
        ['limit=0x10'],
        ['limit=1e1'],
        ['limit=05'],
        ['limit=%2B5'],
        ['limit=%205'],
        ['limit=5.0'],
        ['status=adopted'],
        ['cursor=not-a-cursor'],
        ['cursor=' + Buffer.from('p1:0').toString('base64url')],
        ['colour=brown'],
      ])('refuses ?%s with 400 validation_failed', async (query) => {
        const body = await expectErrorResponse(await service.request(`/pets?${query}`), 400, 'validation_failed')
        // Said in words, not as the schema's regular expression.
        if (/^limit=[^&]*$/.test(query)) expect(body.message).toBe('querystring/limit must be an integer from 1 to 100')
      })

      // Read as the list of its values, a repeated parameter was told "must be string" or that
      // "sold" is not one of "available", "pending", "sold".
      it.each([
        ['limit=5&limit=6', 'limit'],
        ['limit=5&limit=5', 'limit'],
        ['status=sold&status=pending', 'status'],
        ['status=sold&limit=5&status=sold', 'status'],
        ['cursor=MQ&cursor=Mg', 'cursor'],
        ['%6Cimit=5&limit=6', 'limit'],
      ])('refuses ?%s with a message naming the repeated parameter', async (query, name) => {
        const response = await service.request(`/pets?${query}`)
        expect(response.status).toBe(400)
        expect(await response.json()).toEqual({ code: 'validation_failed', message: `querystring/${name} must be given once`, status: 400 })
      })

      it('links the next page until the last one, which has no link', async () => {
        const pets = await seed(5)
        const first = await service.request('/pets?limit=2', { headers: { 'x-forwarded-prefix': '/v1' } })
        const link = first.headers.get('link')
        expect(link).toMatch(/^<\/v1\/pets\?limit=2&cursor=[A-Za-z0-9_-]+>; rel="next"$/)
        expect(await first.json()).toEqual(pets.slice(0, 2))
        const last = await service.request('/pets?limit=5')
        expect(last.headers.get('link')).toBeNull()
      })

      it('keeps the status filter in the next link', async () => {
        await seed(3, 'sold')
        const response = await service.request('/pets?limit=1&status=sold')
        expect(response.headers.get('link')).toMatch(/status=sold/)
      })

      it('walks the pets of one status page by page, each once, in id order, none of another status', async () => {
        const sold = await seed(5, 'sold')
        await seed(2, 'pending')
        const seen: Pet[] = []
        let next: string | undefined = '/pets?limit=2&status=sold'
        while (next) {
          const response: Response = await service.request(next)
          expect(response.status).toBe(200)
          seen.push(...((await response.json()) as Pet[]))
          next = /^<([^>]+)>; rel="next"$/.exec(response.headers.get('link') ?? '')?.[1]
        }
        const soldNow = seen.filter((pet) => sold.some((mine) => mine.id === pet.id))
        expect(soldNow).toEqual(sold)
        expect(seen.every((pet) => pet.status === 'sold')).toBe(true)
        const ids = seen.map((pet) => pet.id)
        expect(new Set(ids).size).toBe(ids.length)
        expect(ids).toEqual([...ids].sort((a, b) => a - b))
      })

      it('walks the whole catalogue without gaps or repeats while pets are being added', async () => {
        const existing = await seed(23)
        const seen: Pet[] = []
        let next: string | undefined = '/pets?limit=4'
        let added = 0
        while (next) {
          const response: Response = await service.request(next)
          expect(response.status).toBe(200)
          seen.push(...((await response.json()) as Pet[]))
          // Someone adds a pet between every two pages.
          await createPet({ name: `late ${added++}`, categoryId: 1 })
          next = /^<([^>]+)>; rel="next"$/.exec(response.headers.get('link') ?? '')?.[1]
        }
        const ids = seen.map((pet) => pet.id)
        expect(new Set(ids).size).toBe(ids.length)
        expect(seen.slice(0, existing.length)).toEqual(existing)
        expect(ids).toEqual([...ids].sort((a, b) => a - b))
      })
    })

    describe('GET /pets/{petId}', () => {
      it('answers 200 with the pet and the deprecation headers', async () => {
        const pet = await createPet({ name: 'Rex', categoryId: 2 })
        const response = await service.request(`/pets/${pet.id}`, { headers: { 'x-forwarded-prefix': '/v1' } })
        expect(response.status).toBe(200)
        expect(await response.json()).toEqual(pet)
        expect(response.headers.get('deprecation')).toMatch(/^@\d+$/)
        expect(response.headers.get('sunset')).toBe('Thu, 05 Dec 2030 00:00:00 GMT')
        expect(response.headers.get('link')).toBe('</v1/pets>; rel="successor-version"')
      })

      it('answers 404 pet_not_found, with the deprecation headers, for an absent pet', async () => {
        const response = await service.request('/pets/424242')
        expect(response.headers.get('sunset')).toBe('Thu, 05 Dec 2030 00:00:00 GMT')
        await expectErrorResponse(response, 404, 'pet_not_found')
      })

      it('answers 200 with the pet whose id is 2^53 - 1, the last id assigned', async () => {
        await service.pool.query('ALTER TABLE pets.pets ALTER COLUMN id RESTART WITH 9007199254740991')
        const pet = await createPet({ name: 'Last', categoryId: 1 })
        expect(pet.id).toBe(Number.MAX_SAFE_INTEGER)
        const response = await service.request('/pets/9007199254740991')
        expect(response.status).toBe(200)
        expect(await response.json()).toEqual(pet)
      })

      it.each(['9007199254740993', '9223372036854775807'])('answers 404 for the well-formed int64 id %s, above 2^53 - 1', async (petId) => {
        await expectErrorResponse(await service.request(`/pets/${petId}`), 404, 'pet_not_found')
      })

      it('answers 400 for a query parameter this operation does not have, as the list does', async () => {
        const pet = await createPet({ name: 'Rex', categoryId: 2 })
        const response = await service.request(`/pets/${pet.id}?status=sold`)
        expect(response.headers.get('sunset')).toBe('Thu, 05 Dec 2030 00:00:00 GMT')
        expect(response.status).toBe(400)
        expect(await response.json()).toEqual({ code: 'validation_failed', message: 'querystring must NOT have the property "status"', status: 400 })
      })

      // Past 100 characters the router refused the id before validation: 400 bad_request, a message naming nothing.
      it.each(['abc', '0', '-1', '1.5', '007', '1e3', '9223372036854775808', '99999999999999999999', '9'.repeat(101), 'x'.repeat(5_000)])(
        'answers 400 validation_failed for the malformed id %s, with the deprecation headers',
        async (petId) => {
          const response = await service.request(`/pets/${petId}`)
          expect(response.headers.get('deprecation')).toBe('@1767225600')
          expect(response.headers.get('sunset')).toBe('Thu, 05 Dec 2030 00:00:00 GMT')
          const body = await expectErrorResponse(response, 400, 'validation_failed')
          expect(body.message).toBe('params/petId must be an integer between 1 and 2^63 - 1')
        },
      )
    })

    describe('concurrent callers', () => {
      // Every pooled connection runs the read queries, not only the one a sequential test reuses
      // (PGlite serves all connections from one session, where a statement name is shared).
      it('answers lists and reads arriving together, each on its own connection, with 200', async () => {
        const pets = await seed(3, 'pending')
        const paths = Array.from({ length: 8 }, (_, i) => ['/pets?limit=2', '/pets?status=pending', `/pets/${pets[i % 3]!.id}`][i % 3]!)
        for (let wave = 0; wave < 2; wave++) {
          const responses = await Promise.all([...paths, ...paths].map((path) => service.request(path)))
          expect(responses.map((response) => response.status)).toEqual(responses.map(() => 200))
        }
        expect(service.pool.totalCount, 'the requests spread over several connections').toBeGreaterThan(1)
      })
    })

    describe('every answer', () => {
      it('answers an unknown path with a 404 Error body', async () => {
        await expectErrorResponse(await service.request('/store/orders'), 404, 'not_found')
        await expectErrorResponse(await service.request('/pets/1/photos', { method: 'DELETE' }), 404, 'not_found')
        // Not the deprecated read with an empty id: no operation has this path, as none has /pets/1/.
        const trailingSlash = await service.request('/pets/')
        expect(trailingSlash.headers.get('deprecation')).toBeNull()
        await expectErrorResponse(trailingSlash, 404, 'not_found')
        // …whatever the method: a 405 would put GET in Allow, which this path does not answer.
        for (const method of ['POST', 'DELETE']) {
          const other = await service.request('/pets/', { method, headers: { 'content-type': 'application/json' }, body: '{}' })
          expect(other.headers.get('allow'), method).toBeNull()
          await expectErrorResponse(other, 404, 'not_found')
        }
      })

      it('answers a known path asked with a method it lacks with 405 and Allow', async () => {
        const list = await service.request('/pets', { method: 'DELETE' })
        expect(list.headers.get('allow')).toBe('GET, HEAD, POST')
        await expectErrorResponse(list, 405, 'method_not_allowed')
        const one = await service.request('/pets/1', { method: 'PATCH', headers: { 'content-type': 'application/json' }, body: '{}' })
        expect(one.headers.get('allow')).toBe('GET, HEAD')
        await expectErrorResponse(one, 405, 'method_not_allowed')
      })

      it('answers 405 and 404 whatever body the request carries: no route reads it', async () => {
        // A client that labels every request application/json (many do, bodiless DELETEs included)
        // was told its JSON was broken, and a Latin-1 or compressed body got 415, instead of 405.
        const bodies: { label: string; headers: Record<string, string>; body?: string | Uint8Array }[] = [
          { label: 'no body', headers: { 'content-type': 'application/json' } },
          { label: 'broken JSON', headers: { 'content-type': 'application/json' }, body: '{bad' },
          { label: 'not UTF-8', headers: { 'content-type': 'application/json' }, body: Buffer.from('{"name":"Caf\xe9"}', 'latin1') },
          { label: 'a rounded number', headers: { 'content-type': 'application/json' }, body: '{"categoryId":1.0000000000000001}' },
          { label: 'Latin-1', headers: { 'content-type': 'application/json; charset=latin1' }, body: '{}' },
          { label: 'gzip', headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' }, body: gzipSync('{}') },
          // A Content-Type that is no media type at all was refused with 415 before any route ran.
          { label: 'no media type', headers: { 'content-type': 'bogus' }, body: '{}' },
          { label: 'two media types', headers: { 'content-type': 'application/json, text/plain' }, body: '{}' },
        ]
        for (const { label, headers, body } of bodies) {
          const one = await service.request('/pets/1', { method: 'DELETE', headers, body })
          expect(one.headers.get('allow'), label).toBe('GET, HEAD')
          await expectErrorResponse(one, 405, 'method_not_allowed')
          const list = await service.request('/pets', { method: 'PUT', headers, body })
          expect(list.headers.get('allow'), label).toBe('GET, HEAD, POST')
          await expectErrorResponse(list, 405, 'method_not_allowed')
          await expectErrorResponse(await service.request('/pets/1/photos', { method: 'POST', headers, body }), 404, 'not_found')
        }
        // The operations that do read a body still refuse the same bodies.
        await expectErrorResponse(await service.request('/pets', { method: 'POST', headers: { 'content-type': 'application/json' } }), 400, 'invalid_json')
        expect(await storedCount(), 'pets stored').toBe(0)
      })

      it('refuses callers without the internal credential with 401 on every operation, and stores nothing', async () => {
        const missing = await fetch(`${service.url}/pets`)
        await expectErrorResponse(missing, 401, 'unauthorized')
        const wrong = await fetch(`${service.url}/pets`, { headers: { 'x-internal-token': 'guess' } })
        await expectErrorResponse(wrong, 401, 'unauthorized')
        const unknownRoute = await fetch(`${service.url}/nowhere`)
        await expectErrorResponse(unknownRoute, 401, 'unauthorized')
        const pet = await createPet({ name: 'Rex', categoryId: 1 })
        await expectErrorResponse(await fetch(`${service.url}/pets/${pet.id}`), 401, 'unauthorized')
        const create = await fetch(`${service.url}/pets`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ name: 'Intruder', categoryId: 1 }),
        })
        await expectErrorResponse(create, 401, 'unauthorized')
        expect(await storedCount(), 'pets stored').toBe(1)
      })

      it('echoes the caller request id, or issues one', async () => {
        const given = await service.request('/pets', { headers: { 'x-request-id': 'req-123' } })
        expect(given.headers.get('x-request-id')).toBe('req-123')
        const issued = await service.request('/pets')
        expect(issued.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/)
      })
    })
  })
}
