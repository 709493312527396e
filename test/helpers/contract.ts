import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js'
import { loadOpenApiDocument, type OpenApiDocument } from '../../gateway/src/openapi/document.ts'

/**
 * The contract check: every response a gateway test receives through the shared client
 * (test/helpers/gateway.ts) is compared with gateway/openapi/openapi.yaml.
 *
 * - The method and path template must match an operation, and the status must be documented for
 *   it. A path (or method) the document does not describe may only get 404, 405 with an `Allow`
 *   header that does not name the method asked, or one of the answers the gateway gives before
 *   routing (the statuses every keyed operation documents: 401, 429 …).
 * - A JSON body must match the response's schema; an Error body's `status` must repeat the HTTP
 *   status.
 * - Every header the response documents as required must be present, and every documented header
 *   that is present must match its schema (X-RateLimit-*, RateLimit*, Retry-After, Location,
 *   Deprecation, Sunset …).
 *
 * The document is read and every validator compiled once per test process.
 */

type Json = null | boolean | number | string | Json[] | { [key: string]: Json }
type JsonObject = { [key: string]: Json }

export class ContractViolation extends Error {
  override readonly name = 'ContractViolation'
}

interface HeaderCheck {
  name: string
  required: boolean
  validate: ValidateFunction
}

interface ResponseCheck {
  headers: HeaderCheck[]
  /** Validators by media type; empty when the response documents no body. */
  bodies: Map<string, ValidateFunction>
  /** The body is the spec's Error, whose `status` repeats the HTTP status. */
  errorBody: boolean
}

interface OperationCheck {
  id: string
  method: string
  template: string
  pattern: RegExp
  responses: Map<string, ResponseCheck>
}

export interface Contract {
  operations: OperationCheck[]
  /** What a path (or method) the document does not describe may get, by status: an Error body and the common headers. */
  unmatched: Map<number, ResponseCheck>
}

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const
const DOCUMENT_ID = 'openapi.json'
const ERROR_REF = '#/components/schemas/Error'

function pointer(document: OpenApiDocument, ref: string): JsonObject {
  if (!ref.startsWith('#/')) throw new Error(`only local $refs are supported: ${ref}`)
  let node: unknown = document
  for (const part of ref.slice(2).split('/')) {
    node = (node as Record<string, unknown>)[part.replace(/~1/g, '/').replace(/~0/g, '~')]
    if (node === undefined) throw new Error(`unresolvable $ref ${ref}`)
  }
  return node as JsonObject
}

/** Follows a Reference Object (response, header) to what it names. */
function resolve(document: OpenApiDocument, node: JsonObject): JsonObject {
  return typeof node.$ref === 'string' ? resolve(document, pointer(document, node.$ref)) : node
}

/** Inline schemas name components as `#/components/…`; in Ajv they live under the document's id. */
function anchorRefs(schema: Json): Json {
  if (Array.isArray(schema)) return schema.map(anchorRefs)
  if (schema === null || typeof schema !== 'object') return schema
  return Object.fromEntries(
    Object.entries(schema).map(([key, value]) => [
      key,
      key === '$ref' && typeof value === 'string' && value.startsWith('#/') ? `${DOCUMENT_ID}${value}` : anchorRefs(value),
    ]),
  )
}

export function compileContract(document: OpenApiDocument = loadOpenApiDocument()): Contract {
  const options = { allErrors: true, strict: false } as const
  const formats = {
    int64: { type: 'number', validate: (value: number) => Number.isInteger(value) },
    'uri-reference': true,
  } as const
  const bodies = new Ajv2020(options)
  // Header values arrive as text: "60" must satisfy `type: integer`.
  const headers = new Ajv2020({ ...options, coerceTypes: true })
  for (const ajv of [bodies, headers]) {
    ajv.addFormat('int64', formats.int64)
    ajv.addFormat('uri-reference', formats['uri-reference'])
  }
  bodies.addSchema({ $id: DOCUMENT_ID, components: anchorRefs(document.components as Json) } as JsonObject)
  // The same schema (the Error body, the rate-limit headers) recurs in nearly every response:
  // each distinct one is compiled once.
  const memo = new Map<string, ValidateFunction>()
  const compile = (ajv: Ajv2020, schema: JsonObject) => {
    const key = `${ajv === headers ? 'header' : 'body'}:${JSON.stringify(schema)}`
    let validate = memo.get(key)
    if (!validate) memo.set(key, (validate = ajv.compile(schema)))
    return validate
  }

  const compileHeader = (name: string, node: JsonObject): HeaderCheck => {
    const header = resolve(document, node)
    const schema = { type: 'object', properties: { value: header.schema ?? {} } }
    return { name: name.toLowerCase(), required: header.required === true, validate: compile(headers, schema) }
  }

  const compileResponse = (node: JsonObject): ResponseCheck => {
    const response = resolve(document, node)
    const content = (response.content ?? {}) as Record<string, JsonObject>
    const bodyValidators = new Map<string, ValidateFunction>()
    let errorBody = false
    for (const [mediaType, media] of Object.entries(content)) {
      const schema = (media.schema ?? {}) as JsonObject
      if (schema.$ref === ERROR_REF) errorBody = true
      bodyValidators.set(mediaType, compile(bodies, anchorRefs(schema) as JsonObject))
    }
    return {
      headers: Object.entries((response.headers ?? {}) as Record<string, JsonObject>).map(([name, header]) => compileHeader(name, header)),
      bodies: bodyValidators,
      errorBody,
    }
  }

  const operations: OperationCheck[] = []
  for (const [template, item] of Object.entries(document.paths)) {
    const pattern = new RegExp(`^${template.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\{[^}/]+\}/g, '[^/]+')}$`)
    for (const method of METHODS) {
      const operation = item[method] as JsonObject | undefined
      if (!operation) continue
      const responses = new Map<string, ResponseCheck>()
      for (const [status, response] of Object.entries(operation.responses as Record<string, JsonObject>)) {
        responses.set(status, compileResponse(response))
      }
      operations.push({ id: String(operation.operationId), method: method.toUpperCase(), template, pattern, responses })
    }
  }

  // What the gateway answers before it knows the route: the statuses every keyed operation has.
  const globalSecurity = (document.security ?? []) as Json[]
  const keyed = operations.filter((operation) => {
    const own = (document.paths[operation.template]?.[operation.method.toLowerCase()] as JsonObject).security as Json[] | undefined
    return (own ?? globalSecurity).length > 0
  })
  const everyKeyed = keyed.map((operation) => new Set([...operation.responses.keys()].map(Number)))
  const beforeRouting = [...(everyKeyed[0] ?? [])].filter((status) => everyKeyed.every((set) => set.has(status)))
  const unmatchedStatuses = new Set([404, 405, ...beforeRouting])

  // Headers an undocumented path's answer must carry: those required on every response of that
  // status, and on every response that documents headers at all (so not getPet's Deprecation on
  // 404, and nothing on what the HTTP parser refuses before a request exists).
  const requiredIn = (responses: ResponseCheck[]) => {
    const [first, ...rest] = responses
    return (first?.headers ?? []).filter(
      (header) => header.required && rest.every((response) => response.headers.some((other) => other.name === header.name && other.required)),
    )
  }
  const allResponses = operations.flatMap((operation) => [...operation.responses.values()])
  const common = requiredIn(allResponses.filter((response) => response.headers.length > 0)).map((header) => header.name)
  const unmatched = new Map<number, ResponseCheck>()
  for (const status of unmatchedStatuses) {
    const same = operations.flatMap((operation) => operation.responses.get(String(status)) ?? [])
    const headers = same.length === 0 ? requiredIn(allResponses) : requiredIn(same)
    unmatched.set(status, { headers: headers.filter((header) => common.includes(header.name)), bodies: new Map(), errorBody: true })
  }

  const errorValidator = compile(bodies, { $ref: `${DOCUMENT_ID}${ERROR_REF}` })
  for (const check of unmatched.values()) check.bodies.set('application/json', errorValidator)
  return { operations, unmatched }
}

// Compiled when a test file loads (about 0.3 s), not inside the first request a test times.
const compiled = compileContract()
const contract = () => compiled

/** The part of the public port the document describes: everything under the base path /v1. */
const API_BASE = '/v1'
/** The docs page and its files: served beside the API, not part of it. */
const isDocsPage = (path: string) => path === '/docs' || path.startsWith('/docs/')

function describeErrors(validate: ValidateFunction): string {
  return (validate.errors ?? []).map((error) => `${error.instancePath || '(body)'} ${error.message ?? ''}`.trim()).join('; ')
}

/** Which operation a request is, or undefined for a path or method the document does not describe. */
export function matchOperation(method: string, path: string, checks: Contract = contract()): OperationCheck | undefined {
  if (!path.startsWith(`${API_BASE}/`)) return undefined
  const apiPath = path.slice(API_BASE.length)
  // HEAD is GET without the body (RFC 9110 §9.3.2): the GET operation's statuses and headers.
  const documented = method === 'HEAD' ? 'GET' : method
  return checks.operations.find((operation) => operation.method === documented && operation.pattern.test(apiPath))
}

/** Throws a ContractViolation naming every way `response` departs from the document. */
export async function assertMatchesContract(method: string, url: URL, response: Response): Promise<void> {
  if (isDocsPage(url.pathname)) return
  const checks = contract()
  const operation = matchOperation(method.toUpperCase(), url.pathname, checks)
  const status = response.status
  const what = `${method.toUpperCase()} ${url.pathname} → ${status}`
  const text = method.toUpperCase() === 'HEAD' ? '' : await response.text()
  const problems: string[] = []

  const expected = operation
    ? (operation.responses.get(String(status)) ?? operation.responses.get(`${String(status)[0]}XX`) ?? operation.responses.get('default'))
    : checks.unmatched.get(status)
  if (!expected && operation) {
    const documented = [...operation.responses.keys()].join(', ')
    throw new ContractViolation(`${what}: status ${status} is not documented for ${operation.id} (documented: ${documented}). Body: ${text.slice(0, 300)}`)
  }
  if (!expected) {
    throw new ContractViolation(
      `${what}: the document has no operation ${method.toUpperCase()} ${url.pathname}; such a request may only get ${[...checks.unmatched.keys()].join(', ')}. Body: ${text.slice(0, 300)}`,
    )
  }

  // RFC 9110 §15.5.6: a 405 names the methods the path does answer, and the one asked is not among them.
  if (status === 405) {
    const allow = (response.headers.get('allow') ?? '').split(',').map((name) => name.trim()).filter(Boolean)
    if (allow.length === 0) problems.push('a 405 must carry an Allow header naming the methods the path answers')
    if (allow.includes(method.toUpperCase())) problems.push(`a 405 for ${method.toUpperCase()} names that very method in Allow: ${allow.join(', ')}`)
  }

  // Headers: every required one present, every documented one that came valid.
  for (const header of expected.headers) {
    const value = response.headers.get(header.name)
    if (value === null) {
      if (header.required) problems.push(`header ${header.name} is documented as required but missing`)
      continue
    }
    if (!header.validate({ value })) problems.push(`header ${header.name}: ${JSON.stringify(value)} ${describeErrors(header.validate)}`)
  }

  // Body: JSON of the documented media type, valid against its schema.
  const { bodies, errorBody } = expected
  if (bodies.size === 0) {
    if (text !== '') problems.push(`the response documents no body, but one came: ${text.slice(0, 200)}`)
  } else if (method.toUpperCase() !== 'HEAD') {
    const mediaType = (response.headers.get('content-type') ?? '').split(';')[0]!.trim().toLowerCase()
    const validate = bodies.get(mediaType)
    if (!validate) {
      problems.push(`content-type ${JSON.stringify(mediaType)} is not documented (documented: ${[...bodies.keys()].join(', ')})`)
    } else {
      let body: unknown
      try {
        body = JSON.parse(text)
      } catch {
        problems.push(`the body is not JSON: ${text.slice(0, 200)}`)
      }
      if (body !== undefined) {
        if (!validate(body)) problems.push(`body ${describeErrors(validate)}: ${text.slice(0, 300)}`)
        else if (errorBody && (body as { status?: unknown }).status !== status) {
          problems.push(`the Error body's status ${String((body as { status?: unknown }).status)} does not repeat the HTTP status`)
        }
      }
    }
  }

  if (problems.length > 0) {
    const name = operation ? `${operation.id} ` : ''
    throw new ContractViolation(`${what} ${name}departs from gateway/openapi/openapi.yaml:\n  - ${problems.join('\n  - ')}`)
  }
}

export interface ContractOptions {
  /** false only for tests that deliberately make the system answer outside the contract. */
  contract?: boolean
}

/**
 * fetch, then the contract check; a departure throws, so it fails the test that made the request.
 * Accepts what openapi-fetch passes (a Request) as well as (url, init).
 */
export async function contractFetch(input: string | URL | Request, init?: RequestInit & ContractOptions): Promise<Response> {
  const { contract: check = true, ...rest } = init ?? {}
  const response = await fetch(input, rest)
  if (check) {
    const method = rest.method ?? (input instanceof Request ? input.method : 'GET')
    const url = new URL(input instanceof Request ? input.url : input)
    await assertMatchesContract(method, url, response.clone())
  }
  return response
}
