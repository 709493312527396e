import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import type { Registry } from 'prom-client'
import {
  CLIENT_TIMEOUTS,
  clientErrorHandler,
  connectionsCheckingIntervalMillis,
  refuseConnect,
  type ClientTimeouts,
} from '../../common/src/http/clientErrors.ts'
import { errorBodies, frameworkErrorHandler } from '../../common/src/http/errorHandler.ts'
import type { PostgresRefusalWatch } from '../../common/src/database/privileges.ts'
import { coalescedWrites } from '../../common/src/http/coalescedWrites.ts'
import { cutStalledConnections } from '../../common/src/http/stalledConnections.ts'
import { expectContinue } from '../../common/src/http/expectContinue.ts'
import { gracefulClose } from '../../common/src/http/gracefulClose.ts'
import { MAX_HEADER_LINES, headerLineLimit } from '../../common/src/http/headerLines.ts'
import { requestContext, requestIdFrom, singleLineRequestLogging } from '../../common/src/http/requestContext.ts'
import { httpMetrics } from '../../common/src/ops/httpMetrics.ts'
import { countParserRefusals } from '../../common/src/ops/parserRefusals.ts'
import { authenticate, requireAuthentication } from './auth/authenticate.ts'
import { privateResponses } from './auth/privateResponses.ts'
import type { GatewayConfig } from './config/loadConfig.ts'
import type { TlsPair } from './config/tlsFiles.ts'
import { secureContextOptions } from './config/tlsRotation.ts'
import { gatewayClientErrors, gatewayErrors, gatewayFrameworkErrors, tooManyHeaderLines } from './errors.ts'
import type { KeyCache } from './keys/keyCache.ts'
import type { GatewayMetrics } from './metrics/gatewayMetrics.ts'
import { pipelinedBehindClose, protocolVersion, requestFraming } from './proxy/requestFraming.ts'
import { BODY_LIMIT_BYTES, acceptOpaqueBodies } from './proxy/opaqueBodies.ts'
import { upstreamProxy } from './proxy/upstreamProxy.ts'
import type { NewBan } from './rateLimit/banJournal.ts'
import { anonymousBucket, knownAddress, trustedHops } from './rateLimit/clientAddress.ts'
import { capConnectionsPerClient } from './connectionsPerClient.ts'
import type { Limiter } from './rateLimit/limiter.ts'
import { rateLimit } from './rateLimit/rateLimit.ts'
import { apiDocs } from './routes/apiDocs.ts'
import { getPetDeprecation } from './routes/getPetDeprecation.ts'
import { storeOrdersRoute } from './routes/storeOrders.ts'
import { refusedPathRoutes, routeRequestTarget } from './routes/requestTarget.ts'

export interface GatewayDependencies {
  /** The config in force; reloads replace it, and the limits follow on the next request. */
  config: () => GatewayConfig
  keys: KeyCache
  limiter: Limiter
  metrics?: GatewayMetrics
  /** Called once per ban, by the gateway whose request started it (log line, record for the CLI). */
  onNewBan?: (ban: NewBan) => void
  internalToken: string
  /** ORDERS_INTERNAL_TOKEN: what the orders upstream gets instead, when upstreams.orders is set. */
  ordersToken?: string
  logger: FastifyBaseLogger
  registry: Registry
  /** How long a client may take to send its headers and its whole request, and leave an answer unread (CLIENT_TIMEOUTS unless set). */
  clientTimeouts?: ClientTimeouts
  /** The certificate the public port serves HTTPS with (server.tls); plain HTTP without. */
  tls?: TlsPair
  /** Says a Postgres refusal once per episode (main.ts); without it, each refused lookup has its error line. */
  postgresRefusals?: PostgresRefusalWatch
}

/**
 * HTTPS on the public port: the pair, HTTP/1.1 only (ALPN; a client that offers only h2 is refused
 * in the handshake), and the handshake held to the header timeout, so a client that opens a
 * connection and never finishes its handshake is cut off as soon as one that never sends its
 * headers (Node's own bound is 120 s, not counted by the header timeout: the HTTP parser starts
 * after the handshake). Node takes the HTTP server's options beside them.
 */
function httpsOptions(pair: TlsPair, timeouts: ClientTimeouts) {
  return { ...secureContextOptions(pair), ALPNProtocols: ['http/1.1'], handshakeTimeout: timeouts.headersTimeoutMillis }
}

/**
 * The gateway's request pipeline, in the order every request goes through it:
 *   0. a connection past the client address's share (server.maxConnectionsPerClient) is closed
 *      unread, before any request on it;
 *   1. request id and one access-log line (key id and plan, never the key); a request pipelined
 *      behind an unsafe request, or an answer that closes the connection, waits for that answer,
 *      an unsafe one for every answer ahead of it, and goes no further if the connection closed;
 *      one with more header lines than are read (1,000) is refused with 431;
 *   2a. identify the bearer key (format and checksum first, then the key cache);
 *   3.  rate limit: ban, minute and day windows, strikes in one store call for a key,
 *       the per-IP anonymous limit otherwise; headers on every answer;
 *   2b. refuse the request whose request line names an HTTP version other than 1.x (505), whose
 *       key was missing or invalid (after it was charged to its IP), or whose framing the gateway
 *       will not pass on (no Host, two Host or Authorization fields);
 *   4.  the proxy to the upstream that owns the path, with header hygiene (a client that sent
 *       `Expect: 100-continue` is told to send its body only now, once stages 1–3 let it through);
 *   5.  one Error body shape for everything that fails on the way;
 *   6.  the answers of one event-loop turn written together, at its end.
 * The API's description (/v1/openapi.json, /docs) is served without a key, limited per IP.
 * Before routing (rewriteUrl), an absolute-form target is reduced to its path and query, and a
 * path that does not percent-decode or holds a `.` or `..` segment is routed to a 400 route, so
 * even that answer passes stages 1–3 instead of being refused by the router before them.
 */
export async function buildGateway(deps: GatewayDependencies): Promise<FastifyInstance> {
  const boot = deps.config()
  const timeouts = deps.clientTimeouts ?? CLIENT_TIMEOUTS
  const countRefusal = countParserRefusals(deps.registry)
  const trusted = trustedHops(boot.server.trustedProxies)
  // A request without Host is refused by requestFraming, with the Error body, not by Node's bare 400.
  const http = { connectionsCheckingInterval: connectionsCheckingIntervalMillis(timeouts), requireHostHeader: false }
  const app = Fastify({
    // Fastify gives https.createServer its `https` options only: the HTTP ones go in with them.
    ...(deps.tls ? { https: { ...http, ...httpsOptions(deps.tls, timeouts) } } : { http }),
    // Only the configured load balancers may speak for the client's address.
    trustProxy: boot.server.trustedProxies.length > 0 ? trusted : false,
    loggerInstance: deps.logger,
    logController: singleLineRequestLogging(),
    genReqId: requestIdFrom,
    bodyLimit: BODY_LIMIT_BYTES,
    requestTimeout: timeouts.requestTimeoutMillis,
    connectionTimeout: timeouts.stalledMillis,
    clientErrorHandler: clientErrorHandler(gatewayClientErrors, deps.logger, countRefusal),
    keepAliveTimeout: 72_000,
    // gracefulClose answers requests that arrive while closing, with the Error body.
    return503OnClosing: false,
    frameworkErrors: frameworkErrorHandler(gatewayFrameworkErrors),
    rewriteUrl: routeRequestTarget,
  })
  app.server.headersTimeout = timeouts.headersTimeoutMillis
  cutStalledConnections(app.server)
  app.server.on('connect', refuseConnect(gatewayClientErrors, deps.logger, countRefusal))
  acceptOpaqueBodies(app)

  // 0 (connections, before any request): one client address holds at most its share of the port.
  capConnectionsPerClient(app.server, {
    limit: boot.server.maxConnectionsPerClient,
    isTrustedProxy: (address) => trusted(address, 0),
    registry: deps.registry,
    logger: deps.logger,
  })

  // 1
  // The client's address too: for a request without a valid key (a flood of 401s, key guessing)
  // it is the only thing that says who sent it.
  await app.register(requestContext, {
    logFields: (request) => ({ keyId: request.apiKey?.id, plan: request.apiKey?.plan ?? 'anonymous', clientAddress: knownAddress(request.ip) }),
  })
  await app.register(gracefulClose, {
    unavailable: () =>
      gatewayErrors.create('service_unavailable', 'This instance is shutting down; retry.', { headers: { 'retry-after': '1' } }),
  })
  // By plan too (DESIGN): a request without a valid key is the per-IP limit's, "anonymous".
  await app.register(httpMetrics, { registry: deps.registry, plan: (request) => request.apiKey?.plan ?? 'anonymous' })
  await app.register(pipelinedBehindClose, { timeouts })
  // 5 (registered early so every stage's failure takes the same shape)
  await app.register(errorBodies, { codes: gatewayFrameworkErrors, reported: deps.postgresRefusals?.report })
  // Before any stage reads a header: a request with more lines than are read is refused whole.
  await app.register(headerLineLimit, { limit: MAX_HEADER_LINES, refusal: tooManyHeaderLines })
  // 2a
  await app.register(authenticate, {
    keys: deps.keys,
    onFailure: deps.metrics?.authFailure,
    beginLookUp: (request, overdue) => deps.limiter.anonymous().beginLookUp(anonymousBucket(request.ip), overdue),
  })
  await app.register(privateResponses)
  // 3
  await app.register(rateLimit, {
    config: deps.config,
    store: deps.limiter.store,
    bans: deps.limiter.bans,
    anonymous: () => deps.limiter.anonymous(),
    observer: deps.metrics?.rateLimit,
    onNewBan: deps.onNewBan,
  })
  // 2b
  await app.register(protocolVersion)
  await app.register(requireAuthentication)
  await app.register(requestFraming)
  // 4
  await app.register(expectContinue, { bodyLimitBytes: BODY_LIMIT_BYTES })
  await app.register(upstreamProxy, {
    ...boot.upstreams.pets,
    name: 'pets',
    internalToken: deps.internalToken,
    internalTokenVariable: 'INTERNAL_TOKEN',
    observer: deps.metrics?.upstream,
    publicPath: '/v1/pets',
    upstreamPath: '/pets',
    // Its createPet stores one pet per Idempotency-Key: a keyed POST may be sent again.
    honoursIdempotencyKeys: true,
  })
  // Its deprecated operation's notice, on the gateway's own answers there too.
  await app.register(getPetDeprecation)
  await app.register(refusedPathRoutes)
  await app.register(storeOrdersRoute, {
    upstream: boot.upstreams.orders,
    token: deps.ordersToken,
    observer: deps.metrics?.upstream,
  })
  // The OpenAPI document and the docs page (public routes: stage 3 limits them per IP)
  await app.register(apiDocs, { config: deps.config, ordersUpstream: boot.upstreams.orders !== undefined })
  // 6 (after every other onSend hook)
  await app.register(coalescedWrites)
  return app
}
