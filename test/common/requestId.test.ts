import { describe, expect, it } from 'vitest'
import { requestIdFrom } from '../../common/src/http/requestContext.ts'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

describe('the request id a service logs and passes on', () => {
  it('reuses a well-formed X-Request-Id, so one id follows a request through both services', () => {
    expect(requestIdFrom({ headers: { 'x-request-id': 'req-42.a:b_c' } })).toBe('req-42.a:b_c')
  })

  it.each([
    ['a UUID', '0b5a3f5e-2c1d-4e8f-9a7b-6c5d4e3f2a1b'],
    ['a W3C trace id', '4bf92f3577b34da6a3ce929d0e0e4736'],
    ['a traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'],
    ['a SHA-1 in capitals', 'DA39A3EE5E6B4B0D3255BFEF95601890AFD80709'],
    ['a 31-character base62 id', 'Zq'.repeat(15) + 'Z'],
  ])('keeps %s', (_case, incoming) => {
    expect(requestIdFrom({ headers: { 'x-request-id': incoming } })).toBe(incoming)
  })

  it.each([
    ['missing', undefined],
    ['empty', ''],
    ['with spaces', 'a b'],
    ['longer than 128 characters', 'x'.repeat(129)],
    ['sent twice', ['a', 'b']],
    ['an API key', generateApiKey()],
    ['an API key inside a longer id', `trace-${generateApiKey()}-1`],
    ['an API key with its prefix in capitals', generateApiKey().replace('aas_', 'AAS_')],
    // Without the prefix the rest is still the whole credential: `aas_` is public.
    ['an API key without its prefix', generateApiKey().slice(4)],
    ['an API key with another separator', generateApiKey().replace('aas_', 'aas-')],
    ['the random part of an API key alone', generateApiKey().slice(4, 36)],
  ])('replaces an id that is %s with a fresh UUID', (_case, incoming) => {
    expect(requestIdFrom({ headers: { 'x-request-id': incoming } })).toMatch(UUID)
  })
})
