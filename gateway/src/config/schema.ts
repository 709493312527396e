import type { Static } from 'typebox'
import { generatedSchemas } from '../../../common/src/schemas/generatedSchemas.ts'
import type * as Authored from './schema.typebox.ts'

/** config/gateway.yaml, as schema.typebox.ts defines it and `npm run generate:schemas` wrote it. Every object refuses unknown keys so a typo never passes silently. */
export const { GatewayConfigSchema } = generatedSchemas<typeof Authored>(import.meta.url, './schema.json')
export type GatewayConfigFile = Static<typeof GatewayConfigSchema>
