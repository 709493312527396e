import { Ajv } from 'ajv'
import type { FastifyInstance } from 'fastify'

/**
 * Bodies are validated strictly (no type coercion, unknown fields refused, nothing silently
 * removed) while path, query and headers, which arrive as strings, are coerced to their types.
 * Fastify's single default Ajv coerces and strips everywhere, which would turn
 * `{"categoryId": "7", "id": 3}` into an accepted pet.
 */
export function useStrictBodyValidation(app: FastifyInstance): void {
  const common = { useDefaults: true, removeAdditional: false, allErrors: false, strict: false } as const
  const bodyAjv = new Ajv({ ...common, coerceTypes: false })
  const parameterAjv = new Ajv({ ...common, coerceTypes: true })
  app.setValidatorCompiler(({ schema, httpPart }) =>
    (httpPart === 'body' ? bodyAjv : parameterAjv).compile(schema),
  )
}
