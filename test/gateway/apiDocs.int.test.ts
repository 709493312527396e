import { describe, expect, it } from 'vitest'
import { loadOpenApiDocument } from '../../gateway/src/openapi/document.ts'
import { expectErrorResponse } from '../helpers/assertions.ts'
import { openRaw, parseAnswer } from '../helpers/rawClient.ts'
import { startGateway } from '../helpers/gateway.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

const SERVERS = { production: 'https://api.adoption.test/v1', staging: 'https://staging.adoption.test/v1' }

describe('the OpenAPI document and the docs page, served by the gateway without a key', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() =>
    startGateway({
      databaseUrl: database.url,
      petsUrl: pets.url,
      configure: (file) => {
        file.openapi = { servers: SERVERS }
      },
    }),
  )

  it('serves /v1/openapi.json: the document as JSON, naming the configured servers, limited per IP', async () => {
    const response = await gateway.request('/v1/openapi.json')
    expect(response.status).toBe(200)
    expect(response.headers.get('content-type')).toMatch(/^application\/json/)
    // Not a key's quota: the anonymous per-IP limit.
    expect(response.headers.get('ratelimit-policy')).toMatch(/^"anonymous";q=\d+;w=60$/)
    const served = (await response.json()) as ReturnType<typeof loadOpenApiDocument>
    expect(served.servers).toEqual([
      { url: SERVERS.production, description: 'Production' },
      { url: SERVERS.staging, description: 'Staging' },
    ])
    expect({ ...served, servers: [] }).toEqual({ ...loadOpenApiDocument(), servers: [] })
  })

  it('ignores whatever key is sent, valid or not', async () => {
    const { key } = await gateway.createKey()
    for (const authorization of [`Bearer ${key}`, 'Bearer aas_not_a_key', 'Basic x']) {
      const response = await gateway.request('/v1/openapi.json', { headers: { authorization } })
      expect(response.status, authorization).toBe(200)
      expect(response.headers.get('ratelimit-policy')).toMatch(/^"anonymous";/)
      await response.arrayBuffer()
    }
  })

  it('serves /docs with every file from the gateway itself and a policy that forbids anything else', async () => {
    const page = await gateway.request('/docs')
    expect(page.status).toBe(200)
    expect(page.headers.get('content-type')).toMatch(/^text\/html/)
    const policy = page.headers.get('content-security-policy') ?? ''
    expect(policy).toContain("default-src 'none'")
    expect(policy).toContain("script-src 'self'")
    // "Try it out" calls only this gateway: the document's other servers offer no CORS to a page.
    expect(policy).toContain("connect-src 'self';")
    expect(page.headers.get('x-ratelimit-limit')).toMatch(/^\d+$/)
    const html = await page.text()
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//)
    const files = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((match) => match[1]!).filter((file) => file.startsWith('docs/'))
    expect(files).toEqual(['docs/swagger-ui.css', 'docs/favicon-32x32.png', 'docs/swagger-ui-bundle.js', 'docs/docs.js'])
    for (const file of files) {
      const response = await gateway.request(`/${file}`)
      expect(response.status, file).toBe(200)
      expect(response.headers.get('content-type'), file).toMatch(/^(text\/css|text\/javascript|image\/png)/)
      const body = await response.text()
      if (file === 'docs/docs.js') expect(body).not.toMatch(/https?:\/\//)
    }
  })

  it('sends Swagger UI compressed to a client that accepts gzip', async () => {
    const response = await gateway.request('/docs/swagger-ui-bundle.js', { headers: { 'accept-encoding': 'gzip' } })
    expect(response.headers.get('content-encoding')).toBe('gzip')
    expect((await response.text()).length).toBeGreaterThan(500_000)
  })

  it('sends it uncompressed to a client that refuses gzip by weight (gzip;q=0) or does not name it', async () => {
    for (const acceptEncoding of ['gzip;q=0, identity', '*;q=1, gzip;q=0', 'br', '']) {
      const response = await gateway.request('/docs/swagger-ui-bundle.js', { headers: { 'accept-encoding': acceptEncoding } })
      expect(response.headers.get('content-encoding'), acceptEncoding).toBeNull()
      await response.arrayBuffer()
    }
  })

  it('answers another method on the docs paths 405 with Allow, without a key and whatever key is sent', async () => {
    for (const [method, path] of [['POST', '/v1/openapi.json'], ['DELETE', '/docs'], ['PUT', '/docs/docs.js']] as const) {
      for (const authorization of [undefined, 'Bearer aas_not_a_key', 'Basic x']) {
        const response = await gateway.request(path, { method, headers: authorization ? { authorization } : {} })
        expect(response.headers.get('allow'), `${method} ${path} ${authorization}`).toBe('GET, HEAD')
        expect(response.headers.get('ratelimit-policy')).toMatch(/^"anonymous";/)
        await expectErrorResponse(response, 405, 'method_not_allowed')
      }
      // Whatever body it carries, even one whose Content-Type is no media type at all (it was 415).
      const withBody = await gateway.request(path, { method, headers: { 'content-type': 'bogus' }, body: '{}' })
      expect(withBody.headers.get('allow'), `${method} ${path} with a bogus Content-Type`).toBe('GET, HEAD')
      await expectErrorResponse(withBody, 405, 'method_not_allowed')
    }
  })

  it('answers another method on a docs path 405 without a key however the path is written, as its GET is served', async () => {
    // The router reads the path percent-decoded and ends it at a '?' or a '#': these are the docs paths.
    for (const target of ['/%64ocs', '/v1/openapi%2Ejson', '/docs/%64ocs.js', '/docs#top']) {
      const read = async (method: string) => {
        const connection = await openRaw(gateway.url)
        connection.socket.write(`${method} ${target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n`)
        await connection.closed
        return connection.answer()
      }
      expect((await read('GET')).split('\r\n', 1)[0], `GET ${target}`).toBe('HTTP/1.1 200 OK')
      const refused = parseAnswer(await read('DELETE'))
      expect(refused.statusLine, `DELETE ${target}`).toBe('HTTP/1.1 405 Method Not Allowed')
      expect(refused.head).toMatch(/^allow: GET, HEAD$/im)
      expect(refused.body).toMatchObject({ code: 'method_not_allowed' })
    }
  })

  it('answers / without a key 404 with the Error body naming /v1, /docs and /v1/openapi.json, whatever key is sent', async () => {
    const { key } = await gateway.createKey()
    for (const authorization of [undefined, `Bearer ${key}`, 'Bearer aas_not_a_key']) {
      const response = await gateway.request('/', { headers: authorization ? { authorization } : {} })
      expect(response.headers.get('www-authenticate'), String(authorization)).toBeNull()
      // Not a key's quota: the anonymous per-IP limit, as for the docs.
      expect(response.headers.get('ratelimit-policy')).toMatch(/^"anonymous";/)
      const body = await expectErrorResponse(response, 404, 'not_found')
      expect(body.message).toBe(
        'No route matches this path. The API is under /v1 (GET /v1/pets, with "Authorization: Bearer <key>"); ' +
          'its documentation is at /docs, its OpenAPI document at /v1/openapi.json.',
      )
    }
    const head = await gateway.request('/', { method: 'HEAD' })
    expect(head.status).toBe(404)
    // Not 405 with an Allow naming GET, which has no operation here either; and whatever the body's
    // type, even one that is no media type at all (it was 415).
    for (const contentType of ['application/json', 'bogus', 'application/json, text/plain']) {
      await expectErrorResponse(await gateway.request('/', { method: 'POST', body: '{}', headers: { 'content-type': contentType } }), 404, 'not_found')
    }
    // Only / itself: another path outside /v1 still asks for a key first.
    await expectErrorResponse(await gateway.request('/pets'), 401, 'missing_api_key')
  })

  // Each answer carries its client's per-IP quota and request id: a shared cache (a CDN) that kept
  // one would hand them to every other client. The docs files were `public, max-age=3600`.
  it('lets a browser keep the docs files, and no shared cache keep any answer without a key', async () => {
    for (const [path, caching] of [
      ['/docs/swagger-ui-bundle.js', 'private, max-age=3600'],
      ['/docs/docs.js', 'private, max-age=3600'],
      ['/docs', 'private, no-cache'],
      ['/v1/openapi.json', 'private, no-cache'],
    ] as const) {
      const response = await gateway.request(path)
      expect(response.status, path).toBe(200)
      expect(response.headers.get('x-ratelimit-remaining'), path).toMatch(/^\d+$/)
      expect(response.headers.get('cache-control'), path).toBe(caching)
      await response.arrayBuffer()
    }
    // Answers a cache keeps unless told otherwise (RFC 9110 §15.1): a 404, a 405, a 301.
    for (const [method, path, status] of [['GET', '/', 404], ['DELETE', '/docs', 405], ['GET', '/docs/', 301]] as const) {
      const response = await gateway.request(path, { method, redirect: 'manual' })
      expect(response.status, `${method} ${path}`).toBe(status)
      expect(response.headers.get('cache-control'), `${method} ${path}`).toBe('no-store')
      await response.arrayBuffer()
    }
  })

  it('redirects /docs/ to /docs', async () => {
    const response = await gateway.request('/docs/', { redirect: 'manual' })
    expect(response.status).toBe(301)
    expect(response.headers.get('location')).toBe('/docs')
  })
})

describe('the docs routes under a tight per-IP limit', () => {
  const database = suiteDatabase()
  const gateway = suiteService(() =>
    startGateway({
      databaseUrl: database.url,
      petsUrl: 'http://127.0.0.1:9',
      configure: (file) => {
        file.anonymous.perMinute = 3
      },
    }),
  )

  it('answers 429 rate_limited with Retry-After once the IP has used its anonymous quota', async () => {
    for (let i = 0; i < 3; i++) expect((await gateway.request(i === 1 ? '/docs' : '/v1/openapi.json')).status).toBe(200)
    const limited = await gateway.request('/v1/openapi.json')
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    await expectErrorResponse(limited, 429, 'rate_limited')
  })
})
