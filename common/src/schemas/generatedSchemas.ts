import { createRequire } from 'node:module'
import type { TSchema } from 'typebox'

/** The exports of a `*.typebox.ts` module that are schemas, with their TypeBox types. */
export type SchemasOf<Module> = { [Name in keyof Module as Module[Name] extends TSchema ? Name : never]: Module[Name] }

/**
 * The JSON Schemas a `*.typebox.ts` module builds with TypeBox, read from the JSON file
 * `npm run generate:schemas` wrote from it (test/schemas/generatedSchemas.test.ts fails while one
 * is stale). The objects are the ones TypeBox builds, so Fastify's type provider and Ajv see no
 * difference; what the services skip is loading TypeBox, some 370 modules and about half a second
 * of CPU at every start of a service or a CLI command. `from` is the caller's import.meta.url.
 */
export function generatedSchemas<Module>(from: string, jsonFile: string): SchemasOf<Module> {
  return createRequire(from)(jsonFile) as SchemasOf<Module>
}
