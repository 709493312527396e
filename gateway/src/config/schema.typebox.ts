/**
 * config/gateway.yaml's schema, authored with TypeBox. The gateway reads it from schema.json
 * (config/schema.ts): run `npm run generate:schemas` after changing this file.
 */
import { Type } from 'typebox'
import { MAX_CONNECTIONS_LIMIT } from '../../../common/src/env.ts'

const Port = Type.Integer({ minimum: 0, maximum: 65_535 })
const Limit = Type.Integer({ minimum: 1, maximum: 1_000_000_000 })
const CustomOrLimit = Type.Union([Limit, Type.Literal('custom')])
const Duration = Type.String({ pattern: '^[1-9][0-9]*(s|m|h|d)$', description: 'a duration like 60s, 5m, 1h, 24h' })
const HttpUrl = Type.String({ pattern: '^https?://[^\\s/]+(/[^\\s]*)?$', description: 'an http:// or https:// URL' })
const ApiBaseUrl = Type.String({ pattern: '^https?://[^\\s/]+(/[^\\s]*)?/v1$', description: 'an http:// or https:// URL ending in /v1' })

const Upstream = Type.Object(
  {
    url: HttpUrl,
    // Whole milliseconds: a shorter timeout would round to none and answer every request 504.
    timeoutSeconds: Type.Optional(Type.Number({ minimum: 0.001, maximum: 300 })),
    maxInFlight: Type.Optional(Type.Integer({ minimum: 1, maximum: 100_000, description: 'a whole number of requests, 1 to 100000' })),
  },
  { additionalProperties: false },
)

// A sliding window: its length and the bucket size that bounds under-admission.
const WindowShape = Type.Object({ length: Duration, bucket: Duration }, { additionalProperties: false })

/** A plan's limit where "custom" means nothing: every plan but enterprise. */
const PlanLimit = Type.Integer({
  minimum: 1,
  maximum: 1_000_000_000,
  description: 'a positive integer (only the enterprise plan may be "custom")',
})
const Plan = Type.Object({ perMinute: PlanLimit, perDay: PlanLimit }, { additionalProperties: false })
// Enterprise keys carry their own limits on the key row (DESIGN: Plans and limits).
const EnterprisePlan = Type.Object({ perMinute: CustomOrLimit, perDay: CustomOrLimit }, { additionalProperties: false })

/**
 * The plans keys can be on (DESIGN: free, pro, business, enterprise). Each is required: a key
 * whose plan the config lacked would have no limits of its own. More plans may be added (the
 * benchmark adds two); their names are lowercase and their limits numbers.
 */
const Plans = Type.Object(
  { free: Plan, pro: Plan, business: Plan, enterprise: EnterprisePlan },
  {
    // Matches every other lowercase name; the four above are validated by their own schemas.
    patternProperties: { '^(?!(?:free|pro|business|enterprise)$)[a-z][a-z0-9_-]{0,31}$': Plan },
    additionalProperties: false,
  },
)

/** config/gateway.yaml. Every object refuses unknown keys so a typo never passes silently. */
export const GatewayConfigSchema = Type.Object(
  {
    server: Type.Object(
      {
        host: Type.String({ minLength: 1 }),
        port: Port,
        opsHost: Type.String({ minLength: 1 }),
        opsPort: Port,
        trustedProxies: Type.Optional(Type.Array(Type.String({ minLength: 1 }), { maxItems: 100 })),
        // Client connections the public port holds at once; unset, derived from the open-file limit.
        maxConnections: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_CONNECTIONS_LIMIT, description: `a whole number of connections, 1 to ${MAX_CONNECTIONS_LIMIT}` })),
        // Connections one client address (an IPv6 /64) holds at once; trusted proxies are not capped.
        maxConnectionsPerClient: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_CONNECTIONS_LIMIT, description: `a whole number of connections, 1 to ${MAX_CONNECTIONS_LIMIT}` })),
        // HTTPS on the public port; unset, TLS terminates in front of the gateway (DESIGN).
        tls: Type.Optional(
          Type.Object(
            {
              certFile: Type.String({ minLength: 1, description: 'the path of a PEM certificate file' }),
              keyFile: Type.String({ minLength: 1, description: 'the path of a PEM private key file' }),
            },
            { additionalProperties: false },
          ),
        ),
      },
      { additionalProperties: false },
    ),
    upstreams: Type.Object(
      { pets: Upstream, orders: Type.Optional(Upstream) },
      { additionalProperties: false },
    ),
    keyCache: Type.Object(
      {
        maxEntries: Type.Integer({ minimum: 1, maximum: 10_000_000 }),
        // Whole milliseconds at least (the cache counts in them).
        ttlSeconds: Type.Number({ minimum: 0.001, maximum: 3_600 }),
        negativeTtlSeconds: Type.Number({ minimum: 0.001, maximum: 3_600 }),
      },
      { additionalProperties: false },
    ),
    plans: Plans,
    windows: Type.Object(
      {
        minute: WindowShape,
        day: WindowShape,
      },
      { additionalProperties: false },
    ),
    anonymous: Type.Object({ perMinute: Limit }, { additionalProperties: false }),
    bans: Type.Object(
      {
        strikes: Type.Integer({ minimum: 1, maximum: 1_000_000 }),
        ladder: Type.Array(Duration, { minItems: 1, maxItems: 20 }),
      },
      { additionalProperties: false },
    ),
    onStoreFailure: Type.Enum(['open', 'closed']),
    // The base addresses the served OpenAPI document names (optional: placeholders otherwise).
    openapi: Type.Optional(
      Type.Object(
        {
          servers: Type.Object({ production: ApiBaseUrl, staging: ApiBaseUrl }, { additionalProperties: false }),
        },
        { additionalProperties: false },
      ),
    ),
    redis: Type.Object(
      {
        commandTimeoutMillis: Type.Integer({ minimum: 1, maximum: 10_000 }),
        keyPrefix: Type.String({ maxLength: 64, pattern: '^[A-Za-z0-9:_-]*$' }),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
)
