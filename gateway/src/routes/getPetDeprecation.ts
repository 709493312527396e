import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { getPetDeprecationHeaders } from '../../../common/src/http/getPetDeprecation.ts'
import { requestedTarget } from './requestTarget.ts'

const GET_PET_PATH = '/v1/pets/'

/** `/v1/pets/{petId}` with an id, as the pets-service routes it: one path segment, not empty. */
function isGetPetPath(url: string): boolean {
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
