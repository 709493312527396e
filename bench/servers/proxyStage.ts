/**
 * The gateway's proxy stage alone: Fastify and gateway/src/proxy/upstreamProxy.ts (the plugin
 * the gateway registers, @fastify/http-proxy with the gateway's handler), /v1/pets → the static
 * upstream's /pets, and nothing else: no request log, metrics, authentication or limits. Set
 * against the bare @fastify/http-proxy row it shows what the proxy stage costs; set against the
 * gateway row, what everything else does.
 *
 * Env: UPSTREAM_URL, PORT, HOST (default 127.0.0.1).
 */
import Fastify from 'fastify'
import { DEFAULT_MAX_IN_FLIGHT } from '../../gateway/src/config/loadConfig.ts'
import { upstreamProxy } from '../../gateway/src/proxy/upstreamProxy.ts'

const upstream = process.env.UPSTREAM_URL
if (!upstream) throw new Error('UPSTREAM_URL must be set')

const app = Fastify()
app.decorateRequest('apiKey', null)
await app.register(upstreamProxy, {
  name: 'pets',
  url: upstream,
  timeoutMillis: 10_000,
  maxInFlight: DEFAULT_MAX_IN_FLIGHT,
  internalToken: 'bench-internal-token',
  internalTokenVariable: 'INTERNAL_TOKEN',
  publicPath: '/v1/pets',
  upstreamPath: '/pets',
})
await app.listen({ host: process.env.HOST || '127.0.0.1', port: Number(process.env.PORT ?? 3303) })

let stopping = false
async function shutdown(): Promise<void> {
  if (stopping) process.exit(1)
  stopping = true
  await app.close()
  process.exit(0)
}
process.on('SIGTERM', () => void shutdown())
process.on('SIGINT', () => void shutdown())
