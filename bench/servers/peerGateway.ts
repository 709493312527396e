/**
 * The ecosystem peer: a gateway assembled the usual way from Fastify plugins. A bearer map
 * (Map of key → plan, loaded at start), `@fastify/rate-limit` on Redis with a per-plan maximum
 * per key, `@fastify/http-proxy` to the static upstream; every plugin with its defaults except
 * what that needs. Like the bare passthrough it writes no request log. It has one fixed window
 * per key (the plugin has no sliding or day window, no bans and no anonymous limit), so it does
 * less than the gateway: the comparison flatters the peer, not the gateway.
 *
 * Env: UPSTREAM_URL, REDIS_URL, PEER_KEYS ("key=plan,key=plan"), PEER_PLANS ("plan=perMinute,…"),
 * PORT, HOST (default 127.0.0.1).
 */
import httpProxy from '@fastify/http-proxy'
import rateLimit from '@fastify/rate-limit'
import Fastify from 'fastify'
import { Redis } from 'ioredis'

declare module 'fastify' {
  interface FastifyRequest {
    plan: string
    keyId: string
  }
}

function required(name: string): string {
  const value = process.env[name]
  if (!value) throw new Error(`${name} must be set`)
  return value
}

function pairs(text: string): Array<[string, string]> {
  return text.split(',').map((entry) => {
    const at = entry.lastIndexOf('=')
    return [entry.slice(0, at), entry.slice(at + 1)]
  })
}

const upstream = required('UPSTREAM_URL')
// RESP2, as the gateway speaks it (and as ioredis did before 6): the rows differ in the plugins, not the wire.
const redis = new Redis(required('REDIS_URL'), { protocol: 2 })
const plans = new Map(pairs(required('PEER_PLANS')).map(([plan, perMinute]) => [plan, Number(perMinute)]))
// The key is only the map's lookup key; Redis and logs see an id.
const keys = new Map(pairs(required('PEER_KEYS')).map(([key, plan], index) => [key, { id: `key${index}`, plan }]))

const app = Fastify()
app.decorateRequest('plan', '')
app.decorateRequest('keyId', '')
app.addHook('onRequest', async (request, reply) => {
  const header = request.headers.authorization
  const key = header?.startsWith('Bearer ') ? keys.get(header.slice(7)) : undefined
  if (!key) return reply.code(401).header('www-authenticate', 'Bearer').send({ error: 'invalid_api_key' })
  request.plan = key.plan
  request.keyId = key.id
})
await app.register(rateLimit, {
  redis,
  timeWindow: 60_000,
  max: (request) => plans.get(request.plan) ?? 0,
  keyGenerator: (request) => request.keyId,
})
await app.register(httpProxy, { upstream, prefix: '/v1/pets', rewritePrefix: '/pets' })
await app.listen({ host: process.env.HOST || '127.0.0.1', port: Number(process.env.PORT ?? 3302) })

let stopping = false
async function shutdown(): Promise<void> {
  if (stopping) process.exit(1)
  stopping = true
  await app.close()
  redis.disconnect()
  process.exit(0)
}
process.on('SIGTERM', () => void shutdown())
process.on('SIGINT', () => void shutdown())
