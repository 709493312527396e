import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import type { Registry } from 'prom-client'
import { errorBodies } from '../../common/src/http/errorHandler.ts'
import { gracefulClose } from '../../common/src/http/gracefulClose.ts'
import { requestContext, requestIdFrom, singleLineRequestLogging } from '../../common/src/http/requestContext.ts'
import { httpMetrics } from '../../common/src/ops/httpMetrics.ts'
import { authenticate } from './auth/authenticate.ts'
import type { GatewayConfig } from './config/loadConfig.ts'
import { gatewayFrameworkErrors } from './errors.ts'
import type { KeyCache } from './keys/keyCache.ts'
import { BODY_LIMIT_BYTES, upstreamProxy } from './proxy/upstreamProxy.ts'
import { storeOrdersRoute } from './routes/storeOrders.ts'

export interface GatewayDependencies {
  config: GatewayConfig
  keys: KeyCache
  internalToken: string
  logger: FastifyBaseLogger
  registry: Registry
}

/**
 * The gateway's request pipeline, in the order every request goes through it:
 *   1. request id and one access-log line (key id and plan, never the key);
 *   2. authentication of the bearer key (format and checksum first, then the key cache);
 *   3. rate limiting (arrives with the rate-limit issue, between 2 and 4);
 *   4. the proxy to the upstream that owns the path, with header hygiene;
 *   5. one Error body shape for everything that fails on the way.
 */
export async function buildGateway(deps: GatewayDependencies): Promise<FastifyInstance> {
  const app = Fastify({
    loggerInstance: deps.logger,
    logController: singleLineRequestLogging(),
    genReqId: requestIdFrom,
    bodyLimit: BODY_LIMIT_BYTES,
    requestTimeout: 30_000,
    connectionTimeout: 60_000,
    keepAliveTimeout: 72_000,
    return503OnClosing: true,
  })

  // 1
  await app.register(requestContext, {
    logFields: (request) => ({ keyId: request.apiKey?.id, plan: request.apiKey?.plan }),
  })
  await app.register(gracefulClose)
  await app.register(httpMetrics, { registry: deps.registry })
  // 5 (registered early so every stage's failure takes the same shape)
  await app.register(errorBodies, { codes: gatewayFrameworkErrors })
  // 2
  await app.register(authenticate, { keys: deps.keys })
  // 4
  await app.register(upstreamProxy, {
    ...deps.config.upstreams.pets,
    internalToken: deps.internalToken,
    publicPath: '/v1/pets',
    upstreamPath: '/pets',
  })
  await app.register(storeOrdersRoute, { upstream: deps.config.upstreams.orders, internalToken: deps.internalToken })
  return app
}
