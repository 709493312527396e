import { readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { SCHEMA_FILES, renderSchemas } from '../../scripts/lib/schemaFiles.ts'

describe('the schemas the services read as JSON', () => {
  it.each(SCHEMA_FILES.map((file) => ({ ...file, name: path.relative(process.cwd(), file.json) })))(
    '$name is what npm run generate:schemas makes of its TypeBox module today',
    async ({ source, json, name }) => {
      const committed = readFileSync(json, 'utf8')
      const fresh = await renderSchemas(source)
      expect(committed === fresh, `${name} is stale: run \`npm run generate:schemas\``).toBe(true)
    },
  )
})
