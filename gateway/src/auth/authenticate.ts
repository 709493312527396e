import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { isDatabaseUnavailable } from '../../../common/src/database/pool.ts'
import { refuseFromHook } from '../../../common/src/http/errorHandler.ts'
import { spreadRetryAfterSeconds } from '../../../common/src/http/retryAfter.ts'
import { RETRY_AFTER_UNAVAILABLE, gatewayErrors } from '../errors.ts'
import { hasApiKeyShape, hasValidChecksum, hashApiKeyHex } from '../keys/apiKeyFormat.ts'
import type { KeyCache } from '../keys/keyCache.ts'
import { isUsable, type ApiKeyRecord } from '../keys/keyRepository.ts'
import type { ApiError } from '../../../common/src/http/apiError.ts'
import type { LookUpTurn } from '../rateLimit/anonymousLimiter.ts'

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated key, or null before authentication and on public routes. */
    apiKey: ApiKeyRecord | null
    /** Why authentication failed; answered by requireAuthentication after the per-IP limit. */
    authFailure: ApiError | null
    /**
     * Why authentication failed: what was wrong with the key (the per-IP limit tells guesses
     * apart), or `unchecked` when Postgres could not be asked about it.
     */
    authFailureReason: AuthFailureReason | 'unchecked' | null
  }
  interface FastifyContextConfig {
    /** Routes served without a key (the OpenAPI document, the docs page). */
    public?: boolean
  }
}

// RFC 6750 §3: the challenge names the scheme; error="invalid_token" when a bearer key was sent,
// and no error code for a request that sent no key or used another scheme (Basic, a bare token).
const REALM = 'Bearer realm="animal-adoption-store"'
const UNLIMITED = { kind: 'go', settled: () => {} } as const satisfies LookUpTurn
/** The longest a lookup waits for the same address's lookups under way before it goes anyway. */
const LOOKUP_WAIT_MILLIS = 1_000

// The same two answers every time: one of each, serialised once, instead of an error per refusal.
const MISSING = gatewayErrors.create('missing_api_key', undefined, { headers: { 'www-authenticate': REALM } })
const INVALID = gatewayErrors.create('invalid_api_key', undefined, {
  headers: { 'www-authenticate': `${REALM}, error="invalid_token"` },
})
// The key pasted without "Bearer " is the likeliest mistake: "not valid" would send its owner
// looking for a new key. The message depends on the scheme alone, so it tells a guesser nothing.
const OTHER_SCHEME = gatewayErrors.create('invalid_api_key', 'Send your API key as "Authorization: Bearer <key>".', {
  headers: { 'www-authenticate': REALM },
})

/** Whether an Authorization value that is no bearer credential uses another scheme (not a bearer one gone wrong). */
const otherScheme = (value: string) => value.slice(0, 7).toLowerCase() !== 'bearer ' && value.toLowerCase() !== 'bearer'

/**
 * The token of an `Authorization: Bearer <token>` value (RFC 6750 §2.1; the scheme's case and
 * the spaces around the token do not matter): '' when there is none, undefined when the value is
 * not a bearer credential of one token. Read by hand: the regular expression it replaces,
 * /^Bearer(?:[ ]+([^ ]*))?[ ]*$/i, backtracked over runs of spaces, and a 16 KB header of them
 * held the event loop for 0.4 s, before any limit applied.
 */
export function bearerToken(value: string): string | undefined {
  const SPACE = 0x20
  if (value.length < 6 || value.slice(0, 6).toLowerCase() !== 'bearer') return undefined
  let start = 6
  if (start < value.length && value.charCodeAt(start) !== SPACE) return undefined
  while (start < value.length && value.charCodeAt(start) === SPACE) start++
  let end = start
  while (end < value.length && value.charCodeAt(end) !== SPACE) end++
  let rest = end
  while (rest < value.length && value.charCodeAt(rest) === SPACE) rest++
  return rest === value.length ? value.slice(start, end) : undefined
}

/** `over_ip_limit`: a well-formed key not looked up, because its address has spent its per-IP limit and its lookups. */
export type AuthFailureReason = 'missing' | 'malformed' | 'unknown' | 'revoked_or_expired' | 'over_ip_limit'

/**
 * The path as the router matches it: up to the first `?` or `#`, percent-decoded but for the
 * reserved characters (find-my-way's reading), so `/%64ocs` is `/docs` here as it is there.
 * rewriteUrl (routeRequestTarget) has already sent a path that does not decode elsewhere.
 */
function routedPath(url: string): string {
  const end = url.search(/[?#]/)
  const path = end < 0 ? url : url.slice(0, end)
  if (path.indexOf('%') < 0) return path
  try {
    return decodeURI(path)
  } catch {
    return path
  }
}

/**
 * Stage 2a: who is calling. Only `Authorization: Bearer <key>` counts (a key in the query
 * string is never read). Malformed, unknown, revoked and expired bearer keys get the same answer
 * so it tells a guesser nothing (a credential of another scheme is told how to send a key); a
 * malformed key costs no Postgres or Redis call (its per-IP count is kept in this process). A
 * failure is recorded, not answered yet: the request is first charged to its client IP (stage 3),
 * then refused by requireAuthentication (stage 2b).
 *
 * A key costs one SHA-256 when the key cache holds it: the cache is keyed by the key's hash, and
 * only keys that passed the checksum ever enter it, so the checksum (a second SHA-256) is checked
 * only on a miss, before Postgres is asked.
 */
export const authenticate = fp(
  async (
    app: FastifyInstance,
    options: {
      keys: KeyCache
      onFailure?: (reason: AuthFailureReason) => void
      /**
       * Whether the per-IP limit lets this request look up a key the cache does not hold now, later
       * or not at all (anonymousLimiter.ts beginLookUp). Without it, every invented key with a valid
       * checksum (anyone can compute one) would cost a Postgres query after the address is refused.
       */
      beginLookUp?: (request: FastifyRequest, overdue: boolean) => LookUpTurn
    },
  ) => {
    app.decorateRequest('apiKey', null)
    app.decorateRequest('authFailure', null)
    app.decorateRequest('authFailureReason', null)

    // A public path asked with a method it does not answer reaches the not-found handler, not
    // its route: its 405 needs no key either, or a client would be told to send one for the docs.
    const publicPaths = new Set<string>()
    app.addHook('onRoute', (route) => {
      if (route.config?.public) publicPaths.add(route.url)
    })
    const isPublic = (request: FastifyRequest) =>
      request.routeOptions.config?.public === true || (request.is404 && publicPaths.has(routedPath(request.url)))

    function refuse(request: FastifyRequest, reason: AuthFailureReason, answer = reason === 'missing' ? MISSING : INVALID): void {
      // A request line naming HTTP/2.0 or HTTP/0.9 is answered 505 whatever its key (protocolVersion):
      // counted here, every such probe without a key would read as a client failing to authenticate.
      if (request.raw.httpVersionMajor === 1) options.onFailure?.(reason)
      request.authFailure = answer
      request.authFailureReason = reason
    }

    /** Settles the request's identity from a key's record (null: no such key). */
    function identify(request: FastifyRequest, record: ApiKeyRecord | null): void {
      if (record === null) refuse(request, 'unknown')
      else if (!isUsable(record)) refuse(request, 'revoked_or_expired')
      else request.apiKey = record
    }

    /** The key could not be checked now (Postgres unavailable, or too slow for the address's lookups): 503. */
    function unchecked(request: FastifyRequest, cause?: unknown): void {
      request.authFailure = gatewayErrors.create('service_unavailable', undefined, {
        headers: { 'retry-after': String(spreadRetryAfterSeconds(RETRY_AFTER_UNAVAILABLE)) },
        cause,
      })
      request.authFailureReason = 'unchecked'
    }

    /**
     * A key the cache did not hold: looked up once the per-IP limit allows it. A request told to
     * wait for the address's lookups under way waits LOOKUP_WAIT_MILLIS at most: with Postgres slow
     * or hung they take seconds each, and waiting in line behind every one of them would keep a
     * request far past its own lookup's bound. It then goes as one of the address's few overdue
     * lookups, or, when those are all under way too, is answered 503 (the per-IP limit decides).
     */
    function lookUp(request: FastifyRequest, hashHex: string, done: (error?: Error) => void, waitingSince?: number): void {
      // A key already being looked up (a client's connections warming up with one key) is one
      // query, and one place under the per-IP limit, however many requests wait for it. A key
      // Postgres found before (held, then dropped by its TTL or a change) is no guess: without
      // this, every key in use from an address that had also spent its limit on guesses (a NAT,
      // a client with one bad key) was refused 429 each time its cache entry ran out, every minute.
      const now = performance.now()
      const since = waitingSince ?? now
      const left = since + LOOKUP_WAIT_MILLIS - now
      const begin = options.beginLookUp
      const turn = begin && !options.keys.isLookingUp(hashHex) && !options.keys.wasFound(hashHex) ? begin(request, left <= 0) : UNLIMITED
      if (turn.kind === 'refused') {
        refuse(request, 'over_ip_limit')
        return done()
      }
      if (turn.kind === 'busy') {
        unchecked(request)
        return done()
      }
      if (turn.kind === 'wait') {
        let timer: NodeJS.Timeout | undefined
        const waited = new Promise<void>((resolve) => (timer = setTimeout(resolve, left)))
        void Promise.race([turn.untilSettled, waited]).then(() => {
          clearTimeout(timer)
          // Its answer may have come meanwhile, from another request's lookup of the same key.
          const held = options.keys.cached(hashHex)
          if (held === undefined) return lookUp(request, hashHex, done, since)
          identify(request, held)
          done()
        })
        return
      }
      const { settled } = turn
      options.keys.fetch(hashHex).then(
        (record) => {
          identify(request, record ?? null)
          settled(request.apiKey !== null)
          done()
        },
        (error: unknown) => {
          settled(false)
          if (!isDatabaseUnavailable(error)) return done(error as Error)
          unchecked(request, error)
          done()
        },
      )
    }

    // Callback style: on a cache hit (nearly every request) nothing here needs a promise.
    app.addHook('onRequest', (request, _reply, done) => {
      if (isPublic(request)) return done()
      const header = request.headers.authorization
      const token = header === undefined || header === '' ? '' : bearerToken(header)
      if (token === '') {
        refuse(request, 'missing')
        return done()
      }
      if (token === undefined) {
        refuse(request, 'malformed', otherScheme(header!) ? OTHER_SCHEME : INVALID)
        return done()
      }
      if (!hasApiKeyShape(token)) {
        refuse(request, 'malformed')
        return done()
      }
      const hashHex = hashApiKeyHex(token)
      const held = options.keys.cached(hashHex)
      if (held !== undefined) {
        identify(request, held)
        return done()
      }
      if (!hasValidChecksum(token)) {
        refuse(request, 'malformed')
        return done()
      }
      lookUp(request, hashHex, done)
    })
  },
  { name: 'authenticate' },
)

/** Stage 2b: refuses the request whose authentication failed, once it has been rate limited. */
export const requireAuthentication = fp(
  async (app: FastifyInstance) => {
    app.addHook('onRequest', (request, reply, done) => {
      if (request.authFailure) refuseFromHook(reply, done, request.authFailure)
      else done()
    })
  },
  { name: 'require-authentication', dependencies: ['authenticate'] },
)
