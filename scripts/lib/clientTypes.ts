import { fileURLToPath } from 'node:url'
import openapiTS, { astToString, type OpenAPI3 } from 'openapi-typescript'
import { loadOpenApiDocument } from '../../gateway/src/openapi/document.ts'

/** The committed TypeScript types of the public API, for openapi-fetch clients. */
export const CLIENT_TYPES_PATH = fileURLToPath(new URL('../../gateway/openapi/schema.ts', import.meta.url))

const HEADER = `// Generated from gateway/openapi/openapi.yaml by \`npm run generate:client\`. Do not edit: a test
// fails when this file and the document disagree.
//
//   import createClient from 'openapi-fetch'
//   import type { paths } from './schema.ts'
//   const client = createClient<paths>({ baseUrl: 'https://api.example.com/v1', headers: { authorization: 'Bearer …' } })

`

/** openapi-typescript on the document, in memory (no file written, nothing fetched). */
export async function renderClientTypes(): Promise<string> {
  const ast = await openapiTS(loadOpenApiDocument() as unknown as OpenAPI3, { rootTypes: true })
  return HEADER + astToString(ast)
}
