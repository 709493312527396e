/**
 * `npm run generate:client`: regenerates gateway/openapi/schema.ts, the TypeScript types of the
 * API (openapi-typescript), from gateway/openapi/openapi.yaml. Run it after editing the document;
 * test/gateway/openapi.test.ts fails while the committed types are stale.
 */
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { CLIENT_TYPES_PATH, renderClientTypes } from './lib/clientTypes.ts'

writeFileSync(CLIENT_TYPES_PATH, await renderClientTypes())
console.log(`wrote ${path.relative(process.cwd(), CLIENT_TYPES_PATH)}`)
