import path from 'node:path'
import { freePort, startChildServer } from '../lib/childServer.ts'
import { checkFirstPetsPage } from './petsPage.ts'
import { firstFailure, privateRedis, staticUpstream } from './shared.ts'
import type { BenchTarget } from './types.ts'

/** The request every proxy row measures (the static upstream answers the same page for any path). */
export const PROXY_PATH = '/v1/pets?limit=20'

const DIRECT_UPSTREAM =
  'bench/servers/staticUpstream.ts in its own process: node:http answering every request with the same ' +
  '20-pet JSON page (≈1.2 KB)'

/** The static upstream itself, no proxy: the ceiling of every proxy row. */
export const directUpstreamTarget = directUpstream({
  id: 'direct-upstream',
  label: 'static upstream, direct',
  description: `${DIRECT_UPSTREAM}; the upstream of every proxy row below, measured without a proxy.`,
})

/**
 * Experiment: the same server with a fixed busy-wait per request. If a server's CPU per request
 * were its own work plus a fixed cost, these rows would cost the direct row's µs/req plus the
 * busy-wait; what they cost beyond that is what the machine charges a slower server (on a shared
 * 2-vCPU VM: the load generator idles between answers, and each answer's write has to wake it).
 */
export const busyUpstreamTargets = [20, 40].map((busyMicros) =>
  directUpstream({
    id: `direct-upstream-busy-${busyMicros}`,
    label: `static upstream, direct, +${busyMicros} µs busy-wait per request (experiment)`,
    description: `${DIRECT_UPSTREAM}, after busy-waiting ${busyMicros} µs on every request.`,
    busyMicros,
  }),
)

function directUpstream(row: { id: string; label: string; description: string; busyMicros?: number }): BenchTarget {
  return {
    id: row.id,
    label: row.label,
    request: 'GET /pets?limit=20',
    description: row.description,
    checkResponse: checkFirstPetsPage,
    async start(context) {
      const upstream = await staticUpstream(context, { busyMicros: row.busyMicros })
      return {
        url: `${upstream.origin}/pets?limit=20`,
        headers: {},
        pids: [upstream.pid],
        failure: firstFailure({ name: 'static upstream', failure: upstream.failure }),
        stop: async () => undefined,
      }
    },
  }
}

interface PassthroughRow {
  id: string
  label: string
  script: string
  description: string
  openLoop?: boolean
}

/** A proxy in front of the static upstream with nothing else in the path (no key, no limits). */
function passthroughTarget(row: PassthroughRow): BenchTarget {
  return {
    id: row.id,
    label: row.label,
    request: `GET ${PROXY_PATH}`,
    description: row.description,
    checkResponse: checkFirstPetsPage,
    ...(row.openLoop ? { openLoop: true } : {}),
    async start(context) {
      const upstream = await staticUpstream(context)
      const port = await freePort()
      const url = `http://127.0.0.1:${port}${PROXY_PATH}`
      const server = await startChildServer({
        name: row.id,
        script: row.script,
        nodeArgs: context.nodeArgs,
        env: { UPSTREAM_URL: upstream.origin, PORT: String(port), HOST: '127.0.0.1' },
        readyUrl: url,
        logFile: path.join(context.logDir, `${row.id}.log`),
      })
      return {
        url,
        headers: {},
        pids: [server.pid],
        supporting: [{ role: 'upstream', pid: upstream.pid }],
        failure: firstFailure({ name: row.id, failure: server.exitReason }, { name: 'static upstream', failure: upstream.failure }),
        stop: () => server.stop(),
      }
    },
  }
}

/** Bare @fastify/http-proxy, defaults: the floor every Node gateway starts from. */
export const httpProxyTarget = passthroughTarget({
  id: 'http-proxy',
  label: 'bare @fastify/http-proxy',
  script: 'bench/servers/barePassthrough.ts',
  openLoop: true,
  description:
    'bench/servers/barePassthrough.ts in its own process: Fastify + @fastify/http-proxy with its defaults ' +
    '(reply-from over undici, 128 connections), /v1/pets → the static upstream’s /pets; no logging, hooks, auth or limits.',
})

/** The gateway's proxy stage (gateway/src/proxy/upstreamProxy.ts) with nothing else around it. */
export const proxyStageTarget = passthroughTarget({
  id: 'proxy-stage',
  label: 'gateway proxy stage alone',
  script: 'bench/servers/proxyStage.ts',
  description:
    'bench/servers/proxyStage.ts in its own process: Fastify + the gateway’s upstreamProxy plugin ' +
    '(@fastify/http-proxy routes and destination checks, the gateway’s undici handler, header hygiene), ' +
    'same mapping; no request log, metrics, authentication or limits.',
})

const PEER_KEY = 'peer-bench-key-0123456789abcdef'

/** The ecosystem peer: bearer map + @fastify/rate-limit on Redis + @fastify/http-proxy. */
export const peerTarget: BenchTarget = {
  id: 'peer',
  label: 'peer: bearer map + @fastify/rate-limit (Redis) + http-proxy',
  request: `GET ${PROXY_PATH}`,
  description:
    'bench/servers/peerGateway.ts in its own process: an onRequest hook looks the bearer key up in a Map ' +
    '(key → plan), @fastify/rate-limit on the private Redis (one fixed 60 s window per key, limit 10⁹ so ' +
    'every request is admitted; one EVALSHA per request), @fastify/http-proxy with defaults; no logging.',
  checkResponse: checkFirstPetsPage,
  openLoop: true,
  async start(context) {
    const [upstream, redis] = [await staticUpstream(context), await privateRedis(context)]
    const port = await freePort()
    const url = `http://127.0.0.1:${port}${PROXY_PATH}`
    const headers = { authorization: `Bearer ${PEER_KEY}` }
    const server = await startChildServer({
      name: 'peer',
      script: 'bench/servers/peerGateway.ts',
      nodeArgs: context.nodeArgs,
      env: {
        UPSTREAM_URL: upstream.origin,
        REDIS_URL: redis.url,
        PEER_KEYS: `${PEER_KEY}=bench`,
        PEER_PLANS: 'bench=1000000000',
        PORT: String(port),
        HOST: '127.0.0.1',
      },
      readyUrl: url,
      readyHeaders: headers,
      logFile: path.join(context.logDir, 'peer.log'),
    })
    return {
      url,
      headers,
      pids: [server.pid],
      supporting: [
        { role: 'upstream', pid: upstream.pid },
        { role: 'Redis', pid: redis.pid },
      ],
      redis,
      failure: firstFailure(
        { name: 'peer', failure: server.exitReason },
        { name: 'static upstream', failure: upstream.failure },
        { name: 'Redis', failure: redis.failure },
      ),
      stop: () => server.stop(),
    }
  },
}
