/**
 * The floor every Node gateway starts from: Fastify and `@fastify/http-proxy` with its defaults,
 * forwarding /v1/pets to the static upstream's /pets (the same mapping the gateway makes), and
 * nothing else: no logging, hooks, auth, limits or header rewriting.
 *
 * Env: UPSTREAM_URL, PORT, HOST (default 127.0.0.1).
 */
import httpProxy from '@fastify/http-proxy'
import Fastify from 'fastify'

const upstream = process.env.UPSTREAM_URL
if (!upstream) throw new Error('UPSTREAM_URL must be set')

const app = Fastify()
await app.register(httpProxy, { upstream, prefix: '/v1/pets', rewritePrefix: '/pets' })
await app.listen({ host: process.env.HOST || '127.0.0.1', port: Number(process.env.PORT ?? 3301) })

let stopping = false
async function shutdown(): Promise<void> {
  if (stopping) process.exit(1)
  stopping = true
  await app.close()
  process.exit(0)
}
process.on('SIGTERM', () => void shutdown())
process.on('SIGINT', () => void shutdown())
