import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { petsErrors } from '../errors.ts'
import { decodeCursor, encodeCursor } from '../http/cursor.ts'
import { publicPrefix } from '../http/forwarded.ts'
import type { PetRepository } from '../repository/petRepository.ts'
import { ListPetsQuery, PetList } from '../schemas/pet.ts'

/** GET /pets (listPets): a bare array in id order; `Link: rel="next"` while more rows follow. */
export const listPetsRoute: FastifyPluginAsyncTypebox<{ pets: PetRepository }> = async (app, { pets }) => {
  app.get('/pets', { schema: { querystring: ListPetsQuery, response: { 200: PetList } } }, async (request, reply) => {
    const { status, cursor } = request.query
    const limit = Number(request.query.limit)
    const afterId = cursor === undefined ? 0 : decodeCursor(cursor)
    if (afterId === undefined) {
      throw petsErrors.create('validation_failed', 'querystring/cursor is not a cursor this API issued')
    }
    // One row more than asked tells whether a next page exists without a count query.
    const rows = await pets.listPage({ limit: limit + 1, status, afterId })
    const page = rows.slice(0, limit)
    const last = page.at(-1)
    if (rows.length > limit && last) {
      // Every part is URL-safe already (a number, a status enum, base64url), so no encoding pass.
      const filter = status ? `&status=${status}` : ''
      reply.header('link', `<${publicPrefix(request)}/pets?limit=${limit}${filter}&cursor=${encodeCursor(last.id)}>; rel="next"`)
    }
    return page
  })
}
