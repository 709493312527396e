import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { INTERNAL_TOKEN_MIN_LENGTH } from '../../../common/src/env.ts'
import { petsErrors } from '../errors.ts'

export const INTERNAL_TOKEN_HEADER = 'x-internal-token'

/**
 * Only the gateway may call this service: every request must carry the shared internal
 * credential, compared in constant time. A guess of the wrong length is refused before the
 * comparison, which reveals only the token's length, not its content.
 */
export const internalAuth = fp(
  async (app: FastifyInstance, options: { token: string }) => {
    if (options.token.length < INTERNAL_TOKEN_MIN_LENGTH) throw new Error(`INTERNAL_TOKEN must be at least ${INTERNAL_TOKEN_MIN_LENGTH} characters`)
    const expected = Buffer.from(options.token, 'utf8')
    app.addHook('onRequest', (request, _reply, done) => {
      const presented = request.headers[INTERNAL_TOKEN_HEADER]
      const candidate = typeof presented === 'string' ? Buffer.from(presented, 'utf8') : undefined
      if (candidate === undefined || candidate.length !== expected.length || !timingSafeEqual(candidate, expected)) {
        done(petsErrors.create('unauthorized'))
        return
      }
      done()
    })
  },
  { name: 'internal-auth' },
)
