/**
 * `npm run generate:schemas`: writes the JSON of each TypeBox schema module (pets-service's
 * schemas, the gateway's config schema) beside it; the services read the JSON, not TypeBox. Run it
 * after editing a `*.typebox.ts` file; test/schemas/generatedSchemas.test.ts fails while one is stale.
 */
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { SCHEMA_FILES, renderSchemas } from './lib/schemaFiles.ts'

for (const { source, json } of SCHEMA_FILES) {
  writeFileSync(json, await renderSchemas(source))
  console.log(`wrote ${path.relative(process.cwd(), json)}`)
}
