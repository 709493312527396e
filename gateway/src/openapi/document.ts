import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { parse } from 'yaml'

/** The one source of truth for the public API: gateway/openapi/openapi.yaml. */
export const OPENAPI_SOURCE = fileURLToPath(new URL('../../openapi/openapi.yaml', import.meta.url))

export interface OpenApiServer {
  url: string
  description?: string
}

/** The parts of the document this code reads; the rest is passed through as it is. */
export interface OpenApiDocument {
  openapi: string
  info: { title: string; version: string; [key: string]: unknown }
  servers: OpenApiServer[]
  paths: Record<string, Record<string, unknown>>
  components: Record<string, Record<string, unknown>>
  [key: string]: unknown
}

/**
 * Reads and parses the document (duplicate keys are an error, as in the gateway config), with
 * each deprecated operation's notice on every answer it documents headers for.
 */
export function loadOpenApiDocument(path = OPENAPI_SOURCE): OpenApiDocument {
  return withDeprecationNoticeOnEveryAnswer(parse(readFileSync(path, 'utf8'), { uniqueKeys: true }) as OpenApiDocument)
}

type Response = { $ref?: string; headers?: Record<string, unknown>; [key: string]: unknown }
type Operation = { deprecated?: boolean; responses?: Record<string, Response> }

const DEPRECATION_NOTICE = ['Deprecation', 'Sunset', 'Link']

/**
 * A deprecated operation's success answer documents its notice (Deprecation, Sunset, the
 * successor Link); both services put the notice on every answer of that operation, errors
 * included, and the document says so here instead of in a copy of each shared error response.
 * Answers that document no headers at all (408, 414, 431: the HTTP parser refuses those before
 * a request exists) carry none, and the notice is not added to them.
 */
export function withDeprecationNoticeOnEveryAnswer(document: OpenApiDocument): OpenApiDocument {
  const sharedResponses = (document.components.responses ?? {}) as Record<string, Response>
  const resolved = (response: Response): Response =>
    response.$ref?.startsWith('#/components/responses/') ? (sharedResponses[response.$ref.slice('#/components/responses/'.length)] ?? response) : response
  const paths: OpenApiDocument['paths'] = {}
  for (const [path, item] of Object.entries(document.paths)) {
    paths[path] = { ...item }
    for (const [method, value] of Object.entries(item)) {
      const operation = value as Operation
      if (operation.deprecated !== true || !operation.responses) continue
      const success = Object.entries(operation.responses).find(([status]) => status.startsWith('2'))?.[1]
      const successHeaders = success ? (resolved(success).headers ?? {}) : {}
      const notice = Object.fromEntries(DEPRECATION_NOTICE.filter((name) => name in successHeaders).map((name) => [name, successHeaders[name]]))
      const responses = Object.fromEntries(
        Object.entries(operation.responses).map(([status, response]) => {
          const answer = resolved(response)
          if (!answer.headers || DEPRECATION_NOTICE.every((name) => name in answer.headers!)) return [status, response]
          return [status, { ...answer, headers: { ...notice, ...answer.headers } }]
        }),
      )
      paths[path][method] = { ...operation, responses }
    }
  }
  return { ...document, paths }
}

/** The document as served: the production and staging base addresses of the running config. */
export function withServers(document: OpenApiDocument, servers: { production: string; staging: string }): OpenApiDocument {
  return {
    ...document,
    servers: [
      { url: servers.production, description: 'Production' },
      { url: servers.staging, description: 'Staging' },
    ],
  }
}

/**
 * The document as served by a gateway that passes /v1/store/orders to an orders service
 * (upstreams.orders): 501 no longer applies, and the answers are that service's, passed through
 * unchanged, beside the gateway's own failures on the way to it.
 */
export function withOrdersUpstream(document: OpenApiDocument): OpenApiDocument {
  const listOrders = document.paths['/store/orders']?.get as { responses: Record<string, unknown> } | undefined
  if (!listOrders) return document
  const { '501': _notImplemented, ...gatewayAnswers } = listOrders.responses
  const ref = (name: string) => ({ $ref: `#/components/responses/${name}` })
  return {
    ...document,
    paths: {
      ...document.paths,
      '/store/orders': {
        ...document.paths['/store/orders'],
        get: {
          ...listOrders,
          summary: 'List store orders',
          description:
            'Passed to the orders service after authentication and rate limiting; its answers ' +
            'reach the client unchanged, with the rate-limit headers added. Orders and their ' +
            "fields are that service's to document; the gateway's own answers are listed.",
          responses: {
            '2XX': { description: "The orders service's answer." },
            ...gatewayAnswers,
            '413': ref('PayloadTooLarge'),
            '502': ref('BadGateway'),
            '504': ref('GatewayTimeout'),
          },
        },
      },
    },
  }
}
