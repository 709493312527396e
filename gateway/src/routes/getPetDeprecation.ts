import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { getPetDeprecationHeaders } from '../../../common/src/http/getPetDeprecation.ts'
import { requestedTarget } from './requestTarget.ts'

const GET_PET_PATH = '/v1/pets/'
/** A percent-encoded A-Z, a-z, 0-9, `-`, `.`, `_` or `~`. */
const ENCODED_UNRESERVED = /%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|2[Dd]|2[Ee]|5[Ff]|7[Ee])/g

/** `/v1/pets/{petId}` with an id, as the pets-service routes it: one path segment, not empty. */
function isGetPetPath(url: string): boolean {
  // `/v1/%70ets/1` is the same path (RFC 3986 §6.2.2.2: an unreserved character encoded is that
  // character), and the router takes it for this operation.
  if (url.indexOf('%') >= 0) url = url.replace(ENCODED_UNRESERVED, (escape) => String.fromCharCode(Number.parseInt(escape.slice(1), 16)))
  if (!url.startsWith(GET_PET_PATH)) return false
  const queryAt = url.indexOf('?', GET_PET_PATH.length)
  const id = url.slice(GET_PET_PATH.length, queryAt === -1 ? undefined : queryAt)
  return id.length > 0 && !id.includes('/')
}

/**
 * GET /v1/pets/{petId} is deprecated, and the pets-service's answers say so. The gateway's own
 * answers on that operation (401, 429, 502, 503, 504…) say it too, so a client that is refused
 * there, or whose calls never reach the pets-service, still learns of it. An answer that came
 * with the headers from the pets-service keeps them as they are. The path is the one the client
 * sent: `/v1/pets/%zz` is this operation with an id that does not decode, though the router was
 * given another path for it.
 */
export const getPetDeprecation = fp(
  async (app: FastifyInstance) => {
    const headers = getPetDeprecationHeaders('/v1')
    app.addHook('onSend', (request, reply, payload, done) => {
      if ((request.method === 'GET' || request.method === 'HEAD') && isGetPetPath(requestedTarget(request)) && !reply.hasHeader('deprecation')) {
        reply.headers(headers)
      }
      done(null, payload)
    })
  },
  { name: 'get-pet-deprecation' },
)
