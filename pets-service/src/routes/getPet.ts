import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { onRequestHookHandler } from 'fastify'
import { getPetDeprecationHeaders } from '../../../common/src/http/getPetDeprecation.ts'
import { petsErrors } from '../errors.ts'
import { publicPrefix } from '../http/forwarded.ts'
import type { PetRepository } from '../repository/petRepository.ts'
import { MAX_SAFE_ID, NoQuery, Pet, PetIdParams } from '../schemas/pet.ts'

const INT64_MAX = 9_223_372_036_854_775_807n

/** GET /pets/{petId} (getPet, deprecated): the replacement is GET /pets with the status filter. */
export const getPetRoute: FastifyPluginAsyncTypebox<{ pets: PetRepository }> = async (app, { pets }) => {
  const schema = { params: PetIdParams, querystring: NoQuery, response: { 200: Pet } }
  // Deprecation headers go on every answer of this operation, errors included: set before the
  // path is validated, so a malformed id's 400 carries them too.
  const announceDeprecation: onRequestHookHandler = (request, reply, done) => {
    // The router gives "/pets/" to this route with an empty id; no operation has that path, any
    // more than "/pets/1/".
    if ((request.params as { petId?: string }).petId === '') return done(petsErrors.create('not_found'))
    reply.headers(getPetDeprecationHeaders(publicPrefix(request)))
    done()
  }
  app.get('/pets/:petId', { schema, onRequest: announceDeprecation }, async (request) => {
    const raw = BigInt(request.params.petId)
    if (raw > INT64_MAX) {
      throw petsErrors.create('validation_failed', 'params/petId must be an integer between 1 and 2^63 - 1')
    }
    // Ids are never assigned above 2^53 - 1, so a larger int64 is well-formed but absent.
    const pet = raw <= BigInt(MAX_SAFE_ID) ? await pets.findById(Number(raw)) : undefined
    if (!pet) throw petsErrors.create('pet_not_found')
    return pet
  })
}
