import { Ajv, type ErrorObject } from 'ajv'
import type { FastifyInstance } from 'fastify'

/**
 * Fastify's message for a schema failure, except that a field the schema does not allow is named
 * (Ajv says only "must NOT have additional properties", which leaves the client guessing).
 */
export function schemaErrorMessage(errors: Partial<ErrorObject>[], dataVar: string): string {
  return errors
    .map((error) => {
      const where = `${dataVar}${error.instancePath ?? ''}`
      const extra = error.keyword === 'additionalProperties' ? (error.params as { additionalProperty?: string } | undefined)?.additionalProperty : undefined
      return extra === undefined ? `${where} ${error.message ?? 'is invalid'}` : `${where} must NOT have the property '${extra}'`
    })
    .join(', ')
}

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
  app.setSchemaErrorFormatter((errors, dataVar) => new Error(schemaErrorMessage(errors, dataVar)))
}
