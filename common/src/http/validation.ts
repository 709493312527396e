import { Ajv, type ErrorObject } from 'ajv'
import type { FastifyInstance } from 'fastify'

/** The longest field name a message repeats whole: the name is the client's, of any length. */
const MAX_ECHOED_NAME = 40

/**
 * Fastify's message for a schema failure, except that a field the schema does not allow is named
 * (Ajv says only "must NOT have additional properties", which leaves the client guessing), a value
 * outside an enum is told the values allowed, a string refused by a pattern is told what the
 * pattern means (its schema's description) rather than shown the regular expression, and a query
 * parameter given more than once is told so.
 */
export function schemaErrorMessage(errors: Partial<ErrorObject>[], dataVar: string): string {
  return errors
    .map((error) => {
      const where = `${dataVar}${error.instancePath ?? ''}`
      // A parameter given twice is read as the list of its values, which Ajv would call the wrong
      // type ("must be string") or an unknown value; what the client must change is the repeat.
      if (dataVar === 'querystring' && Array.isArray(error.data)) return `${where} must be given once`
      // A pattern is the schema's business; its description says what the client must send.
      const meaning = error.keyword === 'pattern' ? (error.parentSchema as { description?: unknown } | undefined)?.description : undefined
      if (typeof meaning === 'string') return `${where} must be ${meaning}`
      // Ajv says only "must be equal to one of the allowed values"; the client needs to know them.
      const allowed = error.keyword === 'enum' ? (error.params as { allowedValues?: unknown } | undefined)?.allowedValues : undefined
      if (Array.isArray(allowed)) return `${where} must be one of ${allowed.map((value) => JSON.stringify(value)).join(', ')}`
      const extra = error.keyword === 'additionalProperties' ? (error.params as { additionalProperty?: string } | undefined)?.additionalProperty : undefined
      if (extra === undefined) return `${where} ${error.message ?? 'is invalid'}`
      // Quoted as JSON, so a name with quotes or control characters reads unambiguously.
      const name = extra.length > MAX_ECHOED_NAME ? `${extra.slice(0, MAX_ECHOED_NAME)}…` : extra
      return `${where} must NOT have the property ${JSON.stringify(name)}`
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
  // verbose: a failure carries its schema, whose description explains a pattern (schemaErrorMessage).
  const common = { useDefaults: true, removeAdditional: false, allErrors: false, strict: false, verbose: true } as const
  const bodyAjv = new Ajv({ ...common, coerceTypes: false })
  const parameterAjv = new Ajv({ ...common, coerceTypes: true })
  app.setValidatorCompiler(({ schema, httpPart }) =>
    (httpPart === 'body' ? bodyAjv : parameterAjv).compile(schema),
  )
  app.setSchemaErrorFormatter((errors, dataVar) => new Error(schemaErrorMessage(errors, dataVar)))
}
