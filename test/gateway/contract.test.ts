import { describe, expect, it } from 'vitest'
import { assertMatchesContract } from '../helpers/contract.ts'

/** The contract check itself, on made-up answers: it must refuse what the document does not allow. */

const LIMIT_HEADERS = {
  'x-ratelimit-limit': '60',
  'x-ratelimit-remaining': '59',
  'x-ratelimit-reset': '1767225660',
  'ratelimit-policy': '"minute";q=60;w=60, "day";q=1000;w=86400',
  ratelimit: '"minute";r=59;t=60, "day";r=999;t=3600',
  'x-request-id': 'req-1',
}
const DEPRECATION = { deprecation: '@1767225600', sunset: 'Thu, 05 Dec 2030 00:00:00 GMT', link: '</v1/pets>; rel="successor-version"' }
const PET = { id: 1, name: 'Rex', categoryId: 2, status: 'available' }

function answer(status: number, body: unknown, headers: Record<string, string> = LIMIT_HEADERS): Response {
  return new Response(body === undefined ? null : JSON.stringify(body), {
    status,
    headers: { 'content-type': 'application/json; charset=utf-8', ...headers },
  })
}
const error = (status: number, code: string) => ({ code, message: 'm', status })
const check = (method: string, path: string, response: Response) =>
  assertMatchesContract(method, new URL(`http://127.0.0.1${path}`), response)

describe('the contract check', () => {
  it('accepts documented answers', async () => {
    await check('GET', '/v1/pets?limit=1', answer(200, [PET], { ...LIMIT_HEADERS, link: '</v1/pets?cursor=x>; rel="next"' }))
    await check('POST', '/v1/pets', answer(201, PET, { ...LIMIT_HEADERS, location: '/v1/pets/1' }))
    await check('GET', '/v1/pets/1', answer(200, PET, { ...LIMIT_HEADERS, ...DEPRECATION }))
    await check('GET', '/v1/pets/1', answer(429, error(429, 'rate_limited'), { ...LIMIT_HEADERS, ...DEPRECATION, 'retry-after': '3' }))
    await check('GET', '/v1/store/orders', answer(501, error(501, 'not_implemented')))
    await check('GET', '/v1/pets', answer(431, error(431, 'headers_too_large'), {}))
    await check('HEAD', '/v1/pets', new Response(null, { status: 200, headers: LIMIT_HEADERS }))
    await check('GET', '/docs', new Response('<!DOCTYPE html>', { headers: { 'content-type': 'text/html' } }))
  })

  it('refuses a status the operation does not document', async () => {
    await expect(check('GET', '/v1/pets', answer(404, error(404, 'not_found')))).rejects.toThrow(/status 404 is not documented for listPets/)
    await expect(check('POST', '/v1/pets', answer(200, PET))).rejects.toThrow(/status 200 is not documented for createPet/)
  })

  it('refuses missing or malformed documented headers', async () => {
    const { 'x-ratelimit-remaining': _dropped, ...withoutRemaining } = LIMIT_HEADERS
    await expect(check('GET', '/v1/pets', answer(200, [], withoutRemaining))).rejects.toThrow(/x-ratelimit-remaining is documented as required/)
    await expect(check('GET', '/v1/pets', answer(200, [], { ...LIMIT_HEADERS, 'x-ratelimit-remaining': '-1' }))).rejects.toThrow(/x-ratelimit-remaining/)
    await expect(check('GET', '/v1/pets', answer(200, [], { ...LIMIT_HEADERS, ratelimit: 'minute=3' }))).rejects.toThrow(/header ratelimit/)
    await expect(check('GET', '/v1/pets', answer(429, error(429, 'rate_limited')))).rejects.toThrow(/retry-after is documented as required/)
    await expect(check('GET', '/v1/pets', answer(429, error(429, 'rate_limited'), { ...LIMIT_HEADERS, 'retry-after': '0' }))).rejects.toThrow(/retry-after/)
    await expect(check('POST', '/v1/pets', answer(201, PET))).rejects.toThrow(/location is documented as required/)
    await expect(check('GET', '/v1/pets/1', answer(200, PET))).rejects.toThrow(/deprecation is documented as required/)
    await expect(check('GET', '/v1/pets/1', answer(404, error(404, 'pet_not_found')))).rejects.toThrow(/sunset is documented as required/)
    await expect(check('GET', '/v1/pets/1', answer(401, error(401, 'missing_api_key'), { ...LIMIT_HEADERS, 'www-authenticate': 'Bearer' }))).rejects.toThrow(/deprecation is documented as required/)
  })

  it('refuses bodies that do not match the schema', async () => {
    const { status: _status, ...withoutStatus } = PET
    await expect(check('GET', '/v1/pets', answer(200, [withoutStatus]))).rejects.toThrow(/must have required property 'status'/)
    await expect(check('GET', '/v1/pets', answer(200, { pets: [] }))).rejects.toThrow(/must be array/)
    await expect(check('GET', '/v1/pets', answer(200, [{ ...PET, stack: 'at x.ts:1:1' }]))).rejects.toThrow(/additional properties/)
    await expect(check('GET', '/v1/pets', answer(500, { ...error(500, 'internal_error'), detail: 'SELECT' }))).rejects.toThrow(/additional properties/)
    await expect(check('GET', '/v1/pets', answer(400, error(400, 'no_such_code')))).rejects.toThrow(/allowed values/)
    await expect(check('GET', '/v1/pets', answer(400, error(401, 'missing_api_key')))).rejects.toThrow(/does not repeat the HTTP status/)
    await expect(check('GET', '/v1/pets', new Response('[]', { headers: { ...LIMIT_HEADERS, 'content-type': 'text/plain' } }))).rejects.toThrow(
      /content-type "text\/plain" is not documented/,
    )
    await expect(check('GET', '/v1/pets', new Response('<html>', { status: 502, headers: { ...LIMIT_HEADERS, 'content-type': 'application/json' } }))).rejects.toThrow(
      /not JSON/,
    )
  })

  it('lets an undocumented path get only 404, 405 or an answer given before routing, as an Error with the common headers', async () => {
    await check('GET', '/v1/nowhere', answer(404, error(404, 'not_found')))
    await check('DELETE', '/v1/pets/1', answer(405, error(405, 'method_not_allowed'), { ...LIMIT_HEADERS, allow: 'GET, HEAD' }))
    await check('GET', '/v1/nowhere', answer(401, error(401, 'missing_api_key')))
    await expect(check('GET', '/v1/nowhere', answer(200, []))).rejects.toThrow(/has no operation GET \/v1\/nowhere; such a request may only get 404, 405/)
    await expect(check('PUT', '/v1/pets', answer(200, []))).rejects.toThrow(/has no operation PUT/)
    await expect(check('GET', '/v1/nowhere', answer(404, error(404, 'not_found'), {}))).rejects.toThrow(/x-ratelimit-limit is documented as required/)
  })

  it('refuses a 405 without an Allow header, or one whose Allow names the method asked', async () => {
    await expect(check('PUT', '/v1/pets', answer(405, error(405, 'method_not_allowed')))).rejects.toThrow(/must carry an Allow header/)
    await expect(check('PUT', '/v1/pets', answer(405, error(405, 'method_not_allowed'), { ...LIMIT_HEADERS, allow: 'GET, PUT' }))).rejects.toThrow(
      /names that very method/,
    )
  })
})
