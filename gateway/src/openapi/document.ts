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
