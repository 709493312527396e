import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import { OPS_MAX_CONNECTIONS } from '../http/connectionCap.ts'
import { closeQuietConnections } from '../http/gracefulClose.ts'
import { singleLineRequestLogging } from '../http/requestContext.ts'
import type { Registry } from 'prom-client'
import { DependencyDown } from './dependencyDown.ts'

/** Resolves when the dependency is usable; rejects (ideally with DependencyDown) when it is not. */
export type DependencyCheck = () => Promise<void>

export interface OpsServerOptions {
  registry: Registry
  /** Each named dependency must answer for the process to be ready. */
  dependencies: Record<string, DependencyCheck>
  /** False once shutdown has begun, so load balancers stop sending traffic first. */
  isAccepting: () => boolean
  /** False while the service is still starting (waiting for Postgres): not ready, but alive. */
  isStarted?: () => boolean
  logger: FastifyBaseLogger
  checkTimeoutMillis?: number
}

async function withTimeout(check: DependencyCheck, millis: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DependencyDown(`no answer within ${millis} ms`)), millis)
  })
  try {
    await Promise.race([check(), timeout])
  } finally {
    clearTimeout(timer)
  }
}

/**
 * The ops port: liveness, readiness with each dependency's state (and, for one that is down, the
 * reason when its check gave one), and Prometheus metrics.
 */
/** How long a client of the ops port may take to send its request, and stay idle. */
const OPS_CLIENT_TIMEOUT_MILLIS = 10_000

export function buildOpsServer(options: OpsServerOptions): FastifyInstance {
  const ops = Fastify({
    loggerInstance: options.logger.child({ port: 'ops' }) as FastifyBaseLogger,
    // Scrapes and probes every few seconds would drown the access log.
    logController: singleLineRequestLogging(),
    // Probes and scrapes are quick: a client that dribbles its request or idles is let go, as on
    // the public port, not held for Node's defaults (60 s for headers, 5 min for a request).
    connectionTimeout: OPS_CLIENT_TIMEOUT_MILLIS,
    requestTimeout: OPS_CLIENT_TIMEOUT_MILLIS,
  })
  ops.server.headersTimeout = OPS_CLIENT_TIMEOUT_MILLIS
  // The port is reachable by whoever reaches the host (0.0.0.0 on the gateway by default): a flood
  // of it must not take the descriptors the public port, Postgres and the upstream need.
  ops.server.maxConnections = OPS_MAX_CONNECTIONS
  // A probe's or scraper's connection opened and not used yet (a load balancer's TCP check, a
  // pre-opened one) held the shutdown's step that closes this port until its 10 s timeout, past
  // the shutdown's deadline when another step took long: closed at once instead, like the public
  // port's. Its requests carry no body worth a refusal: one still arriving just ends.
  const closeQuiet = closeQuietConnections(ops, (request) => request.socket.destroy())
  ops.addHook('preClose', async () => closeQuiet())
  const timeout = options.checkTimeoutMillis ?? 1_000

  ops.get('/healthz', async () => ({ status: 'ok' }))

  // Probes that arrive while the dependencies are being checked share that check: a flood of
  // /readyz (the port is reachable by whoever reaches the host) costs one Postgres query and one
  // upstream call at a time, not one each.
  let checking: Promise<(readonly [string, 'up' | 'down', string | undefined])[]> | undefined
  const checkDependencies = () =>
    Promise.all(
      Object.entries(options.dependencies).map(async ([name, check]) => {
        try {
          await withTimeout(check, timeout)
          return [name, 'up', undefined] as const
        } catch (error) {
          return [name, 'down', error instanceof DependencyDown ? error.message : undefined] as const
        }
      }),
    )

  ops.get('/readyz', async (_request, reply) => {
    checking ??= checkDependencies().finally(() => (checking = undefined))
    const entries = await checking
    const dependencies = Object.fromEntries(entries.map(([name, state]) => [name, state]))
    const reasons = Object.fromEntries(entries.flatMap(([name, , reason]) => (reason ? [[name, reason]] : [])))
    const accepting = options.isAccepting()
    const started = options.isStarted?.() ?? true
    const ready = started && accepting && entries.every(([, state]) => state === 'up')
    return reply.code(ready ? 200 : 503).send({
      status: ready ? 'ready' : !started ? 'starting' : accepting ? 'not_ready' : 'shutting_down',
      dependencies,
      ...(Object.keys(reasons).length > 0 ? { reasons } : {}),
    })
  })

  ops.get('/metrics', async (_request, reply) => {
    const body = await options.registry.metrics()
    return reply.type(options.registry.contentType).send(body)
  })

  // The same Error body shape as the public port, so a probe or scraper pointed at the wrong path
  // reads a clear answer instead of Fastify's own shape.
  ops.setNotFoundHandler((_request, reply) =>
    reply.code(404).send({ code: 'not_found', message: 'The ops port serves GET /healthz, /readyz and /metrics only.', status: 404 }),
  )

  return ops
}
