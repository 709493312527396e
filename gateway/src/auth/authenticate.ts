import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { isDatabaseUnavailable } from '../../../common/src/database/pool.ts'
import { RETRY_AFTER_UNAVAILABLE, gatewayErrors } from '../errors.ts'
import { isWellFormedApiKey } from '../keys/apiKeyFormat.ts'
import type { KeyCache } from '../keys/keyCache.ts'
import { isUsable, type ApiKeyRecord } from '../keys/keyRepository.ts'
import type { ApiError } from '../../../common/src/http/apiError.ts'

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated key, or null before authentication and on public routes. */
    apiKey: ApiKeyRecord | null
    /** Why authentication failed; answered by requireAuthentication after the per-IP limit. */
    authFailure: ApiError | null
  }
  interface FastifyContextConfig {
    /** Routes served without a key (the OpenAPI document, the docs page). */
    public?: boolean
  }
}

// RFC 6750 §3: the challenge names the scheme; error="invalid_token" when a key was sent.
const REALM = 'Bearer realm="animal-adoption-store"'
const missing = () => gatewayErrors.create('missing_api_key', undefined, { headers: { 'www-authenticate': REALM } })
const invalid = () =>
  gatewayErrors.create('invalid_api_key', undefined, {
    headers: { 'www-authenticate': `${REALM}, error="invalid_token"` },
  })

const BEARER = /^Bearer(?:[ ]+([^ ]*))?[ ]*$/i

export type AuthFailureReason = 'missing' | 'malformed' | 'unknown' | 'revoked_or_expired'

/**
 * Stage 2a: who is calling. Only `Authorization: Bearer <key>` counts (a key in the query
 * string is never read). Malformed, unknown, revoked and expired keys get the same answer so
 * it tells a guesser nothing; a malformed key costs no lookup at all. A failure is recorded,
 * not answered yet: the request is first charged to its client IP (stage 3), then refused
 * by requireAuthentication (stage 2b).
 */
export const authenticate = fp(
  async (app: FastifyInstance, options: { keys: KeyCache; onFailure?: (reason: AuthFailureReason) => void }) => {
    app.decorateRequest('apiKey', null)
    app.decorateRequest('authFailure', null)

    async function identify(header: string | undefined): Promise<ApiKeyRecord | ApiError> {
      const match = header === undefined ? undefined : BEARER.exec(header)
      const token = header === undefined || header === '' ? '' : match ? (match[1] ?? '') : undefined
      if (token === '') {
        options.onFailure?.('missing')
        return missing()
      }
      if (token === undefined || !isWellFormedApiKey(token)) {
        options.onFailure?.('malformed')
        return invalid()
      }
      let record: ApiKeyRecord | undefined
      try {
        record = await options.keys.lookup(token)
      } catch (error) {
        if (!isDatabaseUnavailable(error)) throw error
        return gatewayErrors.create('service_unavailable', undefined, {
          headers: { 'retry-after': RETRY_AFTER_UNAVAILABLE },
          cause: error,
        })
      }
      if (!record) {
        options.onFailure?.('unknown')
        return invalid()
      }
      if (!isUsable(record)) {
        options.onFailure?.('revoked_or_expired')
        return invalid()
      }
      return record
    }

    app.addHook('onRequest', async (request) => {
      if (request.routeOptions.config?.public) return
      const identity = await identify(request.headers.authorization)
      if ('code' in identity) request.authFailure = identity
      else request.apiKey = identity
    })
  },
  { name: 'authenticate' },
)

/** Stage 2b: refuses the request whose authentication failed, once it has been rate limited. */
export const requireAuthentication = fp(
  async (app: FastifyInstance) => {
    app.addHook('onRequest', async (request) => {
      if (request.authFailure) throw request.authFailure
    })
  },
  { name: 'require-authentication', dependencies: ['authenticate'] },
)
