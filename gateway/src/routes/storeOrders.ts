import type { FastifyInstance } from 'fastify'
import type { UpstreamConfig } from '../config/loadConfig.ts'
import { gatewayErrors } from '../errors.ts'
import { upstreamProxy, type UpstreamObserver } from '../proxy/upstreamProxy.ts'

export const ORDERS_NOT_AVAILABLE = 'Store orders are not available yet.'

/**
 * GET /v1/store/orders: the spec names it and nothing more. It is authenticated (and limited)
 * like every route, then answered 501 until config/gateway.yaml names an orders upstream.
 */
export async function storeOrdersRoute(
  app: FastifyInstance,
  options: { upstream?: UpstreamConfig; token?: string; observer?: UpstreamObserver },
): Promise<void> {
  if (options.upstream) {
    if (options.token === undefined) throw new Error('an orders upstream needs its own credential (ORDERS_INTERNAL_TOKEN)')
    await app.register(upstreamProxy, {
      ...options.upstream,
      name: 'orders',
      internalToken: options.token,
      internalTokenVariable: 'ORDERS_INTERNAL_TOKEN',
      observer: options.observer,
      publicPath: '/v1/store/orders',
      upstreamPath: '/store/orders',
    })
    return
  }
  app.get('/v1/store/orders', async () => {
    throw gatewayErrors.create('not_implemented', ORDERS_NOT_AVAILABLE)
  })
}
