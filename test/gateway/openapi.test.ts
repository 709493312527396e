import { readFileSync } from 'node:fs'
import { createConfig, lintFromString } from '@redocly/openapi-core'
import { describe, expect, it } from 'vitest'
import { DEFAULT_API_SERVERS, parseGatewayConfig, resolveGatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import type { ApiError, ErrorBody } from '../../common/src/http/apiError.ts'
import { gatewayErrors } from '../../gateway/src/errors.ts'
import { TRANSFER_CODING_NOT_DECODED } from '../../gateway/src/proxy/requestFraming.ts'
import { ORDERS_NOT_AVAILABLE } from '../../gateway/src/routes/storeOrders.ts'
import { OPENAPI_SOURCE, loadOpenApiDocument, withOrdersUpstream, withServers } from '../../gateway/src/openapi/document.ts'
import { petsErrors } from '../../pets-service/src/errors.ts'
import { CLIENT_TYPES_PATH, renderClientTypes } from '../../scripts/lib/clientTypes.ts'

type Node = Record<string, unknown>

const document = loadOpenApiDocument()
const PARSER_REFUSALS = ['408', '414', '431']
const RATE_LIMIT_HEADERS = ['X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset', 'RateLimit-Policy', 'RateLimit']

function resolve(node: Node): Node {
  const ref = node.$ref
  if (typeof ref !== 'string') return node
  return resolve(ref.slice(2).split('/').reduce<Node>((parent, part) => parent[part] as Node, document as unknown as Node))
}

function operation(path: string, method: string): Node {
  const found = document.paths[path]?.[method] as Node | undefined
  expect(found, `${method.toUpperCase()} ${path}`).toBeDefined()
  return found!
}

const responsesOf = (op: Node) =>
  Object.entries(op.responses as Record<string, Node>).map(([status, response]) => [status, resolve(response)] as const)

const headerNames = (response: Node) => Object.keys((response.headers ?? {}) as Node)
const requiredHeaderNames = (response: Node) =>
  Object.entries((response.headers ?? {}) as Record<string, Node>)
    .filter(([, header]) => resolve(header).required === true)
    .map(([name]) => name)

const operations = Object.entries(document.paths).flatMap(([path, item]) =>
  Object.entries(item).map(([method, op]) => ({ path, method, op: op as Node })),
)

/**
 * Findings of Redocly's strictest built-in ruleset that are the truth, not mistakes. Anything
 * else, error or warning, fails the test.
 */
const ACCEPTED_FINDINGS = [
  // A private API: there is no licence to name.
  { ruleId: 'info-license', pointer: '#/info' },
  // Placeholders; the served document names the servers of config/gateway.yaml (openapi.servers).
  { ruleId: 'no-server-example.com', pointer: '#/servers/0/url' },
  { ruleId: 'no-server-example.com', pointer: '#/servers/1/url' },
  // GET /store/orders has no success answer yet: it answers 501 until an orders upstream exists.
  { ruleId: 'operation-2xx-response', pointer: '#/paths/~1store~1orders/get/responses' },
]

describe('the OpenAPI document (gateway/openapi/openapi.yaml)', () => {
  it("passes Redocly's recommended-strict lint (offline, no network)", async () => {
    const config = await createConfig({ extends: ['recommended-strict'] })
    const problems = await lintFromString({ source: readFileSync(OPENAPI_SOURCE, 'utf8'), absoluteRef: OPENAPI_SOURCE, config })
    const findings = problems.map((problem) => ({
      ruleId: problem.ruleId,
      pointer: problem.location[0]?.pointer,
      severity: problem.severity,
      message: problem.message,
    }))
    const unexpected = findings.filter(
      (finding) => !ACCEPTED_FINDINGS.some((accepted) => accepted.ruleId === finding.ruleId && accepted.pointer === finding.pointer),
    )
    expect(unexpected).toEqual([])
    // An accepted finding that no longer occurs is removed from the list.
    for (const accepted of ACCEPTED_FINDINGS) expect(findings).toContainEqual(expect.objectContaining(accepted))
  })

  it('is OpenAPI 3.1, version 1.0.0, with production and staging servers ending in /v1', () => {
    expect(document.openapi).toMatch(/^3\.1\.\d+$/)
    expect(document.info.version).toBe('1.0.0')
    expect(document.servers.map((server) => server.description)).toEqual(['Production', 'Staging'])
    for (const server of document.servers) expect(server.url).toMatch(/^https:\/\/[^/]+\/v1$/)
    expect((document.tags as Node[]).map((tag) => tag.name)).toContain('animals')
  })

  it('describes the three catalogue operations under the tag animals, getPet deprecated with its removal date', () => {
    const ids = { listPets: operation('/pets', 'get'), createPet: operation('/pets', 'post'), getPet: operation('/pets/{petId}', 'get') }
    for (const [id, op] of Object.entries(ids)) {
      expect(op.operationId).toBe(id)
      expect(op.tags).toEqual(['animals'])
    }
    expect(ids.getPet.deprecated).toBe(true)
    expect(ids.getPet.description).toMatch(/2030-12-05/)
    expect(ids.listPets.deprecated).toBeUndefined()
    expect(operation('/store/orders', 'get').operationId).toBe('listStoreOrders')
  })

  it('has the schemas PetStatus, NewPet, Pet and Error, and the HTTP bearer scheme on every keyed operation', () => {
    const schemas = document.components.schemas as Record<string, Node>
    expect(Object.keys(schemas)).toEqual(expect.arrayContaining(['PetStatus', 'NewPet', 'Pet', 'Error']))
    expect(schemas.PetStatus!.enum).toEqual(['available', 'pending', 'sold'])
    expect(schemas.NewPet!.required).toEqual(['name', 'categoryId'])
    expect(schemas.Pet!.required).toEqual(expect.arrayContaining(['id', 'name', 'categoryId']))
    expect(schemas.Error!.required).toEqual(['code', 'message', 'status'])
    expect(document.components.securitySchemes).toEqual({ bearerAuth: expect.objectContaining({ type: 'http', scheme: 'bearer' }) })
    expect(document.security).toEqual([{ bearerAuth: [] }])
    // Only the document itself is served without a key.
    expect(operations.filter(({ op }) => op.security !== undefined).map(({ op }) => op.operationId)).toEqual(['getOpenApiDocument'])
  })

  it("lists exactly the error codes a client can receive (gateway and pets-service), each with a status some response documents", () => {
    const error = (document.components.schemas as Record<string, Node>).Error!
    const code = (error.properties as Record<string, Node>).code!
    const declared = new Map<string, number>()
    for (const catalogue of [gatewayErrors, petsErrors]) {
      for (const name of catalogue.codes()) declared.set(name, (catalogue as unknown as Record<string, { status: number }>)[name]!.status)
    }
    // The pets-service's 401 refuses a caller without the internal credential; through the
    // gateway it can only mean the gateway's own credential is wrong, which it answers with 502
    // (proxy.int.test.ts), so no client of this API ever receives it.
    declared.delete('unauthorized')
    expect([...(code.enum as string[])].sort()).toEqual([...declared.keys()].sort())
    const documentedStatuses = new Set(operations.flatMap(({ op }) => responsesOf(op).map(([status]) => Number(status))))
    for (const [name, status] of declared) {
      // A 405 answers a method no operation describes, so no operation's responses can list it.
      if (name !== 'method_not_allowed') expect(documentedStatuses, `${name} (${status})`).toContain(status)
      expect(code.description, `${name} in the code description`).toContain(`\`${name}\` (${status})`)
    }
  })

  it('gives every error response an example body that the API really sends for its code', () => {
    // The message a client reads for each example's code: the code's own, from whichever service
    // answers it. Two examples show a message written for one answer rather than the code's own.
    const sent = (code: string) =>
      [gatewayErrors, petsErrors]
        .filter((catalogue) => (catalogue.codes() as string[]).includes(code))
        .map((catalogue) => (catalogue.create as (code: string) => ApiError)(code).toBody())
    const specific: Record<string, ErrorBody[]> = {
      // Ajv's wording, as createPet answers {"name":"Rex"}.
      validation_failed: [{ code: 'validation_failed', message: "body must have required property 'categoryId'", status: 400 }],
      not_implemented: [
        { code: 'not_implemented', message: ORDERS_NOT_AVAILABLE, status: 501 },
        { code: 'not_implemented', message: TRANSFER_CODING_NOT_DECODED, status: 501 },
      ],
    }
    const components = document.components.responses as Record<string, Node>
    for (const [name, response] of Object.entries(components)) {
      const example = ((response.content as Record<string, Node>)['application/json']!.example ?? {}) as ErrorBody
      const answers = specific[example.code] ?? sent(example.code)
      expect(answers, name).toContainEqual(example)
    }
  })

  it('documents the rate-limit headers on every response, Retry-After on every 429 and 503', () => {
    for (const { path, method, op } of operations) {
      for (const [status, response] of responsesOf(op)) {
        const where = `${method.toUpperCase()} ${path} ${status}`
        // 408, 414 and 431 come from the HTTP parser, before a request exists to limit: no headers.
        if (PARSER_REFUSALS.includes(status)) expect(response.headers, where).toBeUndefined()
        else expect(requiredHeaderNames(response), where).toEqual(expect.arrayContaining(RATE_LIMIT_HEADERS))
        if (status === '429' || status === '503') expect(requiredHeaderNames(response), where).toContain('Retry-After')
        const content = response.content as Record<string, Node> | undefined
        expect(Object.keys(content ?? {}), where).toEqual(['application/json'])
      }
    }
  })

  it('documents Location on 201, Link on listPets, Deprecation, Sunset and Link on every answer of getPet the parser does not refuse, and Idempotency-Key on createPet', () => {
    const created = Object.fromEntries(responsesOf(operation('/pets', 'post')))
    expect(requiredHeaderNames(created['201']!)).toContain('Location')
    expect(created['422']!.description).toMatch(/idempotency_key_reused/)
    const parameters = (operation('/pets', 'post').parameters as Node[]).map(resolve)
    expect(parameters).toContainEqual(expect.objectContaining({ name: 'Idempotency-Key', in: 'header', required: false }))
    expect(headerNames(Object.fromEntries(responsesOf(operation('/pets', 'get')))['200']!)).toContain('Link')
    const getPet = Object.fromEntries(responsesOf(operation('/pets/{petId}', 'get')))
    const statuses = Object.keys(getPet)
    expect(statuses).toEqual(expect.arrayContaining(['200', '400', '401', '404', '429', '502', '503', '504', ...PARSER_REFUSALS]))
    for (const status of statuses) {
      if (PARSER_REFUSALS.includes(status)) expect(headerNames(getPet[status]!), status).toEqual([])
      else expect(requiredHeaderNames(getPet[status]!), status).toEqual(expect.arrayContaining(['Deprecation', 'Sunset', 'Link']))
    }
    // No other operation is deprecated, and none of theirs gained the notice.
    for (const { path, method, op } of operations.filter(({ path }) => path !== '/pets/{petId}')) {
      expect(op.deprecated, `${method} ${path}`).toBeUndefined()
      for (const [status, response] of responsesOf(op)) expect(headerNames(response), `${method} ${path} ${status}`).not.toContain('Deprecation')
    }
    const sunset = resolve((getPet['200']!.headers as Record<string, Node>).Sunset!)
    expect((sunset.schema as Node).const).toBe('Thu, 05 Dec 2030 00:00:00 GMT')
  })

  it('documents the orders service\'s answers instead of 501 when config names an orders upstream, and still passes the lint', async () => {
    const served = withOrdersUpstream(document)
    const responses = (served.paths['/store/orders']!.get as { responses: Record<string, unknown> }).responses
    expect(Object.keys(responses).sort()).toEqual(['2XX', '400', '401', '408', '413', '414', '429', '431', '500', '502', '503', '504', '505'])
    expect({ ...served, paths: { ...served.paths, '/store/orders': document.paths['/store/orders'] } }).toEqual(document)
    const config = await createConfig({ extends: ['recommended-strict'] })
    const problems = await lintFromString({ source: JSON.stringify(served), absoluteRef: OPENAPI_SOURCE, config })
    const ordersFindings = problems.filter((problem) => problem.location[0]?.pointer?.startsWith('#/paths/~1store~1orders'))
    expect(ordersFindings.map((problem) => `${problem.ruleId}: ${problem.message}`)).toEqual([])
  })

  it('is served with the servers of the running config', () => {
    const served = withServers(document, { production: 'https://api.adoption.test/v1', staging: 'https://staging.adoption.test/v1' })
    expect(served.servers).toEqual([
      { url: 'https://api.adoption.test/v1', description: 'Production' },
      { url: 'https://staging.adoption.test/v1', description: 'Staging' },
    ])
    expect({ ...served, servers: document.servers }).toEqual(document)
  })
})

describe('openapi.servers in config/gateway.yaml', () => {
  const shipped = () => parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))

  it('is optional, with placeholder servers by default', () => {
    const file = shipped()
    delete file.openapi
    expect(resolveGatewayConfig(file, {}).openapi.servers).toEqual(DEFAULT_API_SERVERS)
  })

  it('names servers ending in /v1, and refuses others with the line', () => {
    const text = readFileSync('config/gateway.yaml', 'utf8')
    const custom = text.replace('production: https://api.example.com/v1', 'production: https://api.adoption.test/v1')
    expect(resolveGatewayConfig(parseGatewayConfig(custom), {}).openapi.servers.production).toBe('https://api.adoption.test/v1')
    const wrong = text.replace('production: https://api.example.com/v1', 'production: https://api.adoption.test/v2')
    expect(() => parseGatewayConfig(wrong)).toThrow(/openapi\.servers\.production must be an http:\/\/ or https:\/\/ URL ending in \/v1/)
  })

  it('refuses a server with a user:password, which the document served to anyone would publish, without repeating it', () => {
    const text = readFileSync('config/gateway.yaml', 'utf8')
    const withCredential = text.replace('production: https://api.example.com/v1', 'production: https://u:S3cretSrv@api.example.com/v1')
    expect(() => resolveGatewayConfig(parseGatewayConfig(withCredential), {})).toThrow(/openapi\.servers\.production must hold no user:password/)
    expect(() => resolveGatewayConfig(parseGatewayConfig(withCredential), {})).not.toThrow(/S3cretSrv/)
  })
})

describe('the typed client (gateway/openapi/schema.ts)', () => {
  it('is what npm run generate:client makes of the document today', async () => {
    const committed = readFileSync(CLIENT_TYPES_PATH, 'utf8')
    const fresh = await renderClientTypes()
    expect(committed === fresh, 'gateway/openapi/schema.ts is stale: run `npm run generate:client`').toBe(true)
  })
})
