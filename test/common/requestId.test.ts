import { describe, expect, it } from 'vitest'
import { requestIdFrom } from '../../common/src/http/requestContext.ts'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

describe('the request id a service logs and passes on', () => {
  it('reuses a well-formed X-Request-Id, so one id follows a request through both services', () => {
    expect(requestIdFrom({ headers: { 'x-request-id': 'req-42.a:b_c' } })).toBe('req-42.a:b_c')
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
  ])('replaces an id that is %s with a fresh UUID', (_case, incoming) => {
    expect(requestIdFrom({ headers: { 'x-request-id': incoming } })).toMatch(UUID)
  })
})
