import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { petsErrors } from '../errors.ts'

export const INTERNAL_TOKEN_HEADER = 'x-internal-token'

const digest = (value: string) => createHash('sha256').update(value, 'utf8').digest()

/**
 * Only the gateway may call this service: every request must carry the shared internal
 * credential. Comparing fixed-length digests keeps the check constant-time whatever the
 * length of the guess.
 */
export const internalAuth = fp(
  async (app: FastifyInstance, options: { token: string }) => {
    if (options.token.length < 16) throw new Error('INTERNAL_TOKEN must be at least 16 characters')
    const expected = digest(options.token)
    app.addHook('onRequest', async (request) => {
      const presented = request.headers[INTERNAL_TOKEN_HEADER]
      if (typeof presented !== 'string' || !timingSafeEqual(digest(presented), expected)) {
        throw petsErrors.create('unauthorized')
      }
    })
  },
  { name: 'internal-auth' },
)
