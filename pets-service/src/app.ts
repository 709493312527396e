import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import type { IncomingHttpHeaders } from 'node:http'
import type { Registry } from 'prom-client'
import { CLIENT_TIMEOUTS, clientErrorHandler, connectionsCheckingIntervalMillis } from '../../common/src/http/clientErrors.ts'
import { MAX_HEADER_LINES, headerLineLimit } from '../../common/src/http/headerLines.ts'
import { coalescedWrites } from '../../common/src/http/coalescedWrites.ts'
import { cutStalledConnections } from '../../common/src/http/stalledConnections.ts'
import { errorBodies, frameworkErrorHandler } from '../../common/src/http/errorHandler.ts'
import { expectContinue } from '../../common/src/http/expectContinue.ts'
import { gracefulClose } from '../../common/src/http/gracefulClose.ts'
import { requestContext, requestIdFrom, singleLineRequestLogging } from '../../common/src/http/requestContext.ts'
import { useStrictBodyValidation } from '../../common/src/http/validation.ts'
import { httpMetrics } from '../../common/src/ops/httpMetrics.ts'
import { countParserRefusals } from '../../common/src/ops/parserRefusals.ts'
import type { ApiError } from '../../common/src/http/apiError.ts'
import { petsClientErrors, petsErrors, petsFrameworkErrors } from './errors.ts'
import { internalAuth } from './http/internalAuth.ts'
import { firstNumberRoundedToInteger, firstRepeatedMember, instancePathAt, type NumberLiteral } from './http/exactNumbers.ts'
import type { PetRepository } from './repository/petRepository.ts'
import type { PostgresRefusalWatch } from '../../common/src/database/privileges.ts'
import { authCheckRoute } from './routes/authCheck.ts'
import { createPetRoute } from './routes/createPet.ts'
import { getPetRoute } from './routes/getPet.ts'
import { listPetsRoute } from './routes/listPets.ts'

export interface PetsServiceDependencies {
  pets: PetRepository
  internalToken: string
  /** Also accepted while the credential is rotated (INTERNAL_TOKEN_PREVIOUS). */
  previousInternalToken?: string
  logger: FastifyBaseLogger
  registry: Registry
  /** Says a Postgres refusal once per episode (main.ts); without it, each refused request has its error line. */
  postgresRefusals?: PostgresRefusalWatch
}

export const BODY_LIMIT_BYTES = 1_048_576

/**
 * The header lines read of a request: the gateway passes on up to a client's MAX_HEADER_LINES
 * behind its own (credential, caller id, prefix, request id, address, Via, length and type), and
 * none of them may be dropped; more than this is refused with 431, not cut short.
 */
const HEADER_LINES = MAX_HEADER_LINES + 100

/**
 * The bytes of request target and header names and values read (Node's maxHeaderSize): the 16 KiB
 * the gateway reads of a client's, and room for the headers it adds on the way (its own, under
 * 1 KiB, and the credential). With Node's 16 KiB alone, a request the gateway had taken and charged
 * was refused here with 431. And a byte a header line: the gateway passes a repeated header on as
 * one line, its values joined with ", " (Node's reading), two bytes more for each copy in place of
 * its name, one at least. The 16 KiB three times over: the gateway passes a path on as URL parsing
 * makes it, the characters it percent-encodes (`{` as `%7B`, and `}"<>` and the backquote) three
 * bytes each, so 8 KiB of braces came here as 24 KiB and was answered 414.
 */
function headerBytes(tokens: (string | undefined)[]): number {
  return 3 * 16_384 + 1_024 + MAX_HEADER_LINES + Math.max(...tokens.map((token) => token?.length ?? 0))
}

/**
 * The pets-service pipeline, in order: request id and one log line, metrics, the gateway's
 * internal credential (`Expect: 100-continue` is answered only after it), validation, the three
 * catalogue routes, GET /auth-check for the gateway's readiness probe, and one error shape for all.
 */
export async function buildPetsService(deps: PetsServiceDependencies): Promise<FastifyInstance> {
  const app = Fastify({
    loggerInstance: deps.logger,
    logController: singleLineRequestLogging(),
    genReqId: requestIdFrom,
    bodyLimit: BODY_LIMIT_BYTES,
    // Slow or stalled clients are cut off instead of holding sockets forever.
    requestTimeout: CLIENT_TIMEOUTS.requestTimeoutMillis,
    http: {
      connectionsCheckingInterval: connectionsCheckingIntervalMillis(CLIENT_TIMEOUTS),
      maxHeaderSize: headerBytes([deps.internalToken, deps.previousInternalToken]),
    },
    connectionTimeout: CLIENT_TIMEOUTS.stalledMillis,
    clientErrorHandler: clientErrorHandler(petsClientErrors, deps.logger, countParserRefusals(deps.registry)),
    keepAliveTimeout: 72_000,
    // gracefulClose answers requests that arrive while closing, with the Error body.
    return503OnClosing: false,
    frameworkErrors: frameworkErrorHandler(petsFrameworkErrors),
    // The router refused a path parameter longer than 100 characters (414 from Fastify, a bare 400
    // here) before validation could name it: an id of any length is validation's to judge, and the
    // request target is bounded by maxHeaderSize anyway. No route parameter is a regular expression.
    routerOptions: { maxParamLength: 16_384 },
  })
  app.server.headersTimeout = CLIENT_TIMEOUTS.headersTimeoutMillis
  cutStalledConnections(app.server)
  useStrictBodyValidation(app)
  // The catalogue speaks JSON only: without this, Fastify would parse text/plain bodies and
  // answer 400 where 415 Unsupported Media Type is the truth.
  app.removeContentTypeParser('text/plain')
  strictJsonBodies(app)

  await app.register(requestContext)
  await app.register(gracefulClose, {
    unavailable: () =>
      petsErrors.create('service_unavailable', 'This instance is shutting down; retry.', { headers: { 'retry-after': '1' } }),
  })
  await app.register(httpMetrics, { registry: deps.registry })
  await app.register(errorBodies, { codes: petsFrameworkErrors, reported: deps.postgresRefusals?.report })
  await app.register(headerLineLimit, {
    limit: HEADER_LINES,
    refusal: () => petsErrors.create('headers_too_large', `The request has more than ${HEADER_LINES.toLocaleString('en-US')} header lines.`),
  })
  await app.register(internalAuth, { token: deps.internalToken, previousToken: deps.previousInternalToken })
  await app.register(expectContinue, { bodyLimitBytes: BODY_LIMIT_BYTES })

  await app.register(listPetsRoute, { pets: deps.pets })
  await app.register(createPetRoute, { pets: deps.pets })
  await app.register(getPetRoute, { pets: deps.pets })
  await app.register(authCheckRoute)
  // After every other onSend hook: the answers of one event-loop turn are written together.
  await app.register(coalescedWrites)
  return app
}

const CHARSET = /;\s*charset\s*=\s*"?([^";\s]*)/gi
const QUOTED = /"(?:[^"\\]|\\.)*"/g

/**
 * The 415 for a JSON body that cannot be read as sent, if it cannot: bytes under a content coding
 * (RFC 9110 §8.4: 415 for a coding the server does not accept, with the codings it does in
 * Accept-Encoding, §15.5.16; read as they are, a gzip body would be "invalid JSON" and a body
 * merely labelled br would be stored as if plain), or a charset other than UTF-8 (RFC 8259 §8.1:
 * JSON is exchanged as UTF-8; a Latin-1 body is not broken JSON but an encoding this API does not take).
 */
function unsupportedEncoding(headers: IncomingHttpHeaders): ApiError | undefined {
  const coding = headers['content-encoding']?.trim().toLowerCase()
  if (coding !== undefined && coding !== '' && coding !== 'identity') {
    return petsErrors.create('unsupported_media_type', `Content-Encoding ${coding.slice(0, 40)} is not supported; send the JSON body uncompressed.`, {
      headers: { 'accept-encoding': 'identity' },
    })
  }
  const contentType = headers['content-type'] ?? ''
  // Two media types (`application/json; charset=utf-8, text/plain`) are no Content-Type, as
  // `application/json, text/plain` is not; its charset would be read as `utf-8,`.
  if (contentType.includes(',') && contentType.replace(QUOTED, '').includes(',')) return petsErrors.create('unsupported_media_type')
  for (const [, charset] of contentType.matchAll(CHARSET)) {
    const name = (charset ?? '').toLowerCase()
    if (name !== 'utf-8' && name !== 'utf8') {
      return petsErrors.create('unsupported_media_type', `application/json bodies are UTF-8; charset=${name.slice(0, 40)} is not supported.`)
    }
  }
  return undefined
}

/**
 * JSON bodies are parsed as Fastify does, with three checks that keep a client's text from being
 * stored as something it never sent: the bytes must be UTF-8 (RFC 8259 §8.1; decoded leniently,
 * `Caf\xE9` would be stored as `Caf\uFFFD`); a number that is not an integer but parses to one
 * (`9007199254740990.5`) would pass the integer schema rounded; and of a member given twice
 * JSON.parse keeps the last, whatever the first held. All three are refused with 400.
 */
function strictJsonBodies(app: FastifyInstance): void {
  const parseJson = app.getDefaultJsonParser('error', 'error')
  const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false })
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    // No route takes this request (the answer is 404 or 405): its body, read to keep the
    // connection in step, is no one's to judge, as Fastify leaves one of an unknown type unjudged.
    // Parsed, a bodiless DELETE labelled application/json got 400 invalid_json instead of 405.
    if (request.is404) return done(null, undefined)
    const unsupported = unsupportedEncoding(request.headers)
    if (unsupported) return done(unsupported)
    let text: string
    try {
      text = utf8.decode(body as Buffer)
    } catch {
      return done(petsErrors.create('invalid_json', 'The request body is not valid UTF-8.'))
    }
    // Both judged once the text is known to be JSON (broken JSON is invalid_json however it reads);
    // a rounded number only where the schema would take the rounded value: elsewhere (a name, a
    // field not allowed) the schema's own message tells the truth.
    const rounded = firstNumberRoundedToInteger(text)
    parseJson(request, text, (error, body) => {
      if (error) return done(isPlainJson(text) ? petsErrors.create('validation_failed', PROTOTYPE_MEMBER) : error)
      const repeated = firstRepeatedMember(text)
      if (repeated !== undefined) return done(petsErrors.create('validation_failed', repeatedMessage(text, repeated)))
      if (rounded === undefined) return done(null, body)
      const validate = request.getValidationFunction('body')
      if (validate !== undefined && !validate(body)) return done(null, body)
      done(petsErrors.create('validation_failed', roundedMessage(text, rounded)))
    })
  })
}

// Refused by the parser as prototype poisoning: valid JSON, so not `invalid_json`, but a member
// no NewPet has, answered as any other unknown member is.
const PROTOTYPE_MEMBER = 'body must NOT have a property "__proto__", nor a "constructor" holding "prototype"'

function isPlainJson(text: string): boolean {
  try {
    JSON.parse(text)
    return true
  } catch {
    return false
  }
}

/** Long enough for any integer or field a client means; a literal or a path of a megabyte is not repeated whole. */
const MAX_ECHOED_LITERAL = 40

const echoed = (text: string) => (text.length > MAX_ECHOED_LITERAL ? `${text.slice(0, MAX_ECHOED_LITERAL)}…` : text)

function repeatedMessage(json: string, repeated: { name: string; valueIndex: number }): string {
  return `body${echoed(instancePathAt(json, repeated.valueIndex))} must be given once`
}

function roundedMessage(json: string, rounded: NumberLiteral): string {
  const { token, index } = rounded
  return `body${echoed(instancePathAt(json, index))} must be an integer; ${echoed(token)} would be rounded to one`
}
