import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { INTERNAL_TOKEN_MIN_LENGTH } from '../../../common/src/env.ts'
import { petsErrors } from '../errors.ts'

export const INTERNAL_TOKEN_HEADER = 'x-internal-token'

function acceptedAmong(candidate: Buffer, accepted: readonly Buffer[]): boolean {
  for (const expected of accepted) if (candidate.length === expected.length && timingSafeEqual(candidate, expected)) return true
  return false
}

/**
 * Only the gateway may call this service: every request must carry the shared internal
 * credential, compared in constant time. A guess of the wrong length is refused before the
 * comparison, which reveals only the token's length, not its content. While the credential is
 * being rotated, the previous one is accepted too (INTERNAL_TOKEN_PREVIOUS), so gateways still
 * sending it keep working until each has been restarted with the new one.
 */
export const internalAuth = fp(
  async (app: FastifyInstance, options: { token: string; previousToken?: string }) => {
    const accepted = [options.token, ...(options.previousToken ? [options.previousToken] : [])].map((token) => {
      if (token.length < INTERNAL_TOKEN_MIN_LENGTH) throw new Error(`INTERNAL_TOKEN must be at least ${INTERNAL_TOKEN_MIN_LENGTH} characters`)
      return Buffer.from(token, 'utf8')
    })
    app.addHook('onRequest', (request, _reply, done) => {
      const presented = request.headers[INTERNAL_TOKEN_HEADER]
      const candidate = typeof presented === 'string' ? Buffer.from(presented, 'utf8') : undefined
      if (candidate === undefined || !acceptedAmong(candidate, accepted)) {
        done(petsErrors.create('unauthorized'))
        return
      }
      done()
    })
  },
  { name: 'internal-auth' },
)
