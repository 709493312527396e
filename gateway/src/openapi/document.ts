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

/** Reads and parses the document; duplicate keys are an error, as in the gateway config. */
export function loadOpenApiDocument(path = OPENAPI_SOURCE): OpenApiDocument {
  return parse(readFileSync(path, 'utf8'), { uniqueKeys: true }) as OpenApiDocument
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
