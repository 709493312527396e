import { fileURLToPath } from 'node:url'
import { Type } from 'typebox'

/** Each TypeBox module whose schemas the services read as JSON, and that JSON file. */
export const SCHEMA_FILES = [
  { source: '../../pets-service/src/schemas/pet.typebox.ts', json: '../../pets-service/src/schemas/pet.schemas.json' },
  { source: '../../gateway/src/config/schema.typebox.ts', json: '../../gateway/src/config/schema.json' },
].map(({ source, json }) => ({
  source: fileURLToPath(new URL(source, import.meta.url)),
  json: fileURLToPath(new URL(json, import.meta.url)),
}))

/** The JSON file's text for a TypeBox module: its exported schemas, by name. */
export async function renderSchemas(source: string): Promise<string> {
  const module = (await import(source)) as Record<string, unknown>
  // By name: Node lists a module's exports sorted, Vitest in the order they are declared.
  const names = Object.keys(module).filter((name) => Type.IsSchema(module[name])).sort()
  const schemas = Object.fromEntries(names.map((name) => [name, module[name]]))
  return `${JSON.stringify(schemas, null, 2)}\n`
}
