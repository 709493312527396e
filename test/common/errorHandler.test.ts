import { afterEach, describe, expect, it, vi } from 'vitest'
import { ApiError } from '../../common/src/http/apiError.ts'
import Fastify from 'fastify'
import { errorBodies, toApiError } from '../../common/src/http/errorHandler.ts'
import { captureLog } from '../helpers/logCapture.ts'
import { petsErrors, petsFrameworkErrors } from '../../pets-service/src/errors.ts'

function fastifyError(code: string, statusCode: number, message = 'boom') {
  return Object.assign(new Error(message), { code, statusCode })
}

describe('errors as clients see them', () => {
  afterEach(() => vi.restoreAllMocks())

  it.each([
    ['FST_ERR_CTP_BODY_TOO_LARGE', 413, 'payload_too_large'],
    ['FST_ERR_CTP_INVALID_MEDIA_TYPE', 415, 'unsupported_media_type'],
    ['FST_ERR_CTP_EMPTY_JSON_BODY', 400, 'invalid_json'],
    ['FST_ERR_CTP_INVALID_CONTENT_LENGTH', 400, 'invalid_json'],
    ['FST_ERR_BAD_URL', 400, 'bad_request'],
  ])('maps Fastify %s to %i %s', (code, status, expected) => {
    const error = toApiError(fastifyError(code, status), petsFrameworkErrors)
    expect(error.toBody()).toEqual({ code: expected, message: expect.any(String), status: petsErrors[expected as 'bad_request'].status })
  })

  it('turns a schema failure into validation_failed carrying the reason', () => {
    const error = Object.assign(new Error('body/name must be string'), { validation: [{}], statusCode: 400 })
    expect(toApiError(error, petsFrameworkErrors).toBody()).toEqual({
      code: 'validation_failed',
      message: 'body/name must be string',
      status: 400,
    })
  })

  // Only a client's mistake is a 4xx: a framework failure of status 500, or a SyntaxError from
  // the service's own JSON.parse (no statusCode), is the service's fault.
  it('answers internal_error, not a 4xx blaming the client, for a Fastify error of status 500 and a SyntaxError of its own', () => {
    const internal = { code: 'internal_error', message: 'Something went wrong on our side.', status: 500 }
    expect(toApiError(fastifyError('FST_ERR_REP_INVALID_PAYLOAD_TYPE', 500), petsFrameworkErrors).toBody()).toEqual(internal)
    expect(toApiError(new SyntaxError('Unexpected token } in JSON at position 1'), petsFrameworkErrors).toBody()).toEqual(internal)
  })

  it('hides the detail of an unexpected error behind internal_error', () => {
    const body = toApiError(new TypeError('cannot read x of undefined at repo.ts:3'), petsFrameworkErrors).toBody()
    expect(body).toEqual({ code: 'internal_error', message: 'Something went wrong on our side.', status: 500 })
  })

  it('answers 503 with Retry-After when Postgres is unreachable', () => {
    const error = toApiError(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }), petsFrameworkErrors)
    expect(error.toBody()).toEqual({ code: 'service_unavailable', message: expect.not.stringContaining('5432'), status: 503 })
    expect(error.headers).toEqual({ 'retry-after': expect.stringMatching(/^[3-7]$/) })
  })

  // README: Retry-After "from 3 to 7 (whole seconds, drawn for each answer)". Every value of the
  // range must be drawn, the last one too: a draw that never reached 7 would crowd the retries
  // of an outage into four seconds instead of five.
  it('draws the 503\'s Retry-After from every whole second from 3 to 7, both ends included', () => {
    const unreachable = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' })
    const drawn = new Set<string>()
    for (const random of [0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999_999]) {
      vi.spyOn(Math, 'random').mockReturnValue(random)
      drawn.add(toApiError(unreachable, petsFrameworkErrors).headers['retry-after']!)
    }
    expect([...drawn].sort()).toEqual(['3', '4', '5', '6', '7'])
  })

  it('answers 503 with Retry-After, not 500, when the process has no file descriptor left to reach Postgres', () => {
    for (const code of ['EMFILE', 'ENFILE']) {
      const error = toApiError(Object.assign(new Error(`connect ${code} 127.0.0.1:5432 - Local (undefined:undefined)`), { code, errno: -24, syscall: 'connect' }), petsFrameworkErrors)
      expect(error.toBody(), code).toEqual({ code: 'service_unavailable', message: expect.not.stringContaining('5432'), status: 503 })
      expect(error.headers).toEqual({ 'retry-after': expect.stringMatching(/^[3-7]$/) })
    }
  })

  // An operator's (or a managed service's) doing, lasting until they mend it: no client can change
  // it and it is no defect of the code. 28P01 cannot be met on the tests' trust-auth Postgres.
  it.each([
    ['42501', 'permission denied for table pets'],
    ['42501', 'permission denied for database "catalogue"'],
    ['28000', 'role "pets" is not permitted to log in'],
    ['28P01', 'password authentication failed for user "pets"'],
    ['3D000', 'database "catalogue" does not exist'],
    ['3F000', 'schema "pets" does not exist'],
    ['42P01', 'relation "pets.pets" does not exist'],
  ])('answers 503 with Retry-After, not 500, when Postgres refuses the role (%s %s)', (code, message) => {
    const error = toApiError(Object.assign(new Error(message), { code, severity: 'ERROR' }), petsFrameworkErrors)
    expect(error.toBody()).toEqual({ code: 'service_unavailable', message: expect.not.stringContaining('pets'), status: 503 })
    expect(error.headers).toEqual({ 'retry-after': expect.stringMatching(/^[3-7]$/) })
  })

  it('passes a declared ApiError through unchanged', () => {
    const declared = petsErrors.create('pet_not_found')
    expect(toApiError(declared, petsFrameworkErrors)).toBe(declared)
    expect(declared).toBeInstanceOf(ApiError)
  })
})

describe('the error line an operator reads', () => {
  async function serving(failure: Error) {
    const log = captureLog()
    const app = Fastify({ logger: { level: 'info', stream: log.stream } })
    await app.register(errorBodies, { codes: petsFrameworkErrors })
    app.get('/boom', async () => {
      throw failure
    })
    const response = await app.inject({ method: 'GET', url: '/boom' })
    await app.close()
    return { response, failed: log.entries().filter((entry) => entry.msg === 'request failed') }
  }

  it('logs "request failed" with internal_error for an unexpected exception answered 500', async () => {
    const { response, failed } = await serving(new TypeError('cannot read x of undefined'))
    expect(response.statusCode).toBe(500)
    expect(failed).toEqual([expect.objectContaining({ level: 50, code: 'internal_error' })])
  })

  it('logs no error line for a deliberate 5xx with nothing behind it', async () => {
    const { response, failed } = await serving(petsErrors.create('internal_error'))
    expect(response.statusCode).toBe(500)
    expect(failed).toEqual([])
  })
})
