import type { Server as TlsServer } from 'node:tls'
import { Registry } from 'prom-client'
import { collectProcessMetrics } from '../../common/src/ops/processMetrics.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { postgresAnswers, requirePostgresGrants, watchPostgresRefusals } from '../../common/src/database/privileges.ts'
import { requireUtf8Database } from '../../common/src/database/encoding.ts'
import { waitForPostgres } from '../../common/src/database/waitForPostgres.ts'
import { purgeHourly } from '../../common/src/database/hourlyPurge.ts'
import { EnvError, databaseUrlFromEnv, drainMillisFromEnv, internalTokenFromEnv, listenOrSay, ordersTokenFromEnv, poolSizeFromEnv, reportStartupFailure, warnOfPublishedToken } from '../../common/src/env.ts'
import {
  CLOSE_DEPENDENCY_MILLIS,
  exitWhenStoppedWhileStarting,
  onShutdownSignal,
} from '../../common/src/lifecycle/shutdown.ts'
import { checkLogLevel, createLogger } from '../../common/src/logger.ts'
import { capConnections, connectionBudget, openFileLimit } from '../../common/src/http/connectionCap.ts'
import { registerConnectionMetrics } from '../../common/src/ops/connectionMetrics.ts'
import { DependencyDown } from '../../common/src/ops/dependencyDown.ts'
import { buildOpsServer } from '../../common/src/ops/opsServer.ts'
import { registerPoolMetrics } from '../../common/src/ops/poolMetrics.ts'
import { createConfigSource } from './config/configSource.ts'
import { ConfigError, DEFAULT_CONFIG_PATH, type GatewayConfig } from './config/loadConfig.ts'
import { warnOfKeysWithoutLimits } from './keys/keysWithoutLimits.ts'
import { certificateExpiry } from './config/tlsFiles.ts'
import { createTlsRotation } from './config/tlsRotation.ts'
import { rememberClientAddress, reportHandshakeFailures } from './handshakeFailures.ts'
import { createGatewayMetrics, createTlsMetrics } from './metrics/gatewayMetrics.ts'
import { GATEWAY_MIGRATIONS, GATEWAY_POSTGRES_NEEDS } from './migrations.ts'
import { UPSTREAM_CONNECTIONS, shutdownAfterDrainMillis } from './proxy/upstreamProxy.ts'
import { createLimiter, redisAclFix, redisCredentialVariables } from './rateLimit/limiter.ts'
import { upstreamAcceptsGateway } from './upstreamCheck.ts'
import { wireGateway } from './wiring.ts'

const logger = createLogger('gateway')

// SIGHUP's default action ends the process. Until the config watch takes the signal over, and
// once it has stopped, a reload sent to every gateway (`docker compose kill -s HUP`, a config
// reloader) must not end one still starting or already closing: it is held, and applied once
// the watch begins.
let reloadHeld = false
const holdReload = () => void (reloadHeld = true)
process.on('SIGHUP', holdReload)

async function main(): Promise<void> {
  const stopStartWatch = exitWhenStoppedWhileStarting(logger, 'start:gateway')
  checkLogLevel()
  const registry = new Registry()
  collectProcessMetrics(registry)
  const metrics = createGatewayMetrics(registry)
  // Replaced once the key repository exists: a reload before then is covered by the check at start.
  let checkKeysWithoutLimits: (config: GatewayConfig) => void = () => undefined
  const configSource = createConfigSource(process.env.GATEWAY_CONFIG || DEFAULT_CONFIG_PATH, process.env, logger, (outcome, reloaded) => {
    metrics.configReload(outcome)
    metrics.expectBanSteps(reloaded.bans.ladderSeconds.length)
    if (outcome === 'success') checkKeysWithoutLimits(reloaded)
  })
  const config = configSource.get()
  metrics.expectBanSteps(config.bans.ladderSeconds.length)
  // HTTPS on the public port when server.tls names a pair (read and checked with the config above).
  const tlsMetrics = config.server.tls ? createTlsMetrics(registry) : undefined
  const tls = config.server.tls ? createTlsRotation(config.server.tls, logger, tlsMetrics?.reload) : undefined
  if (tls) tlsMetrics?.inForce(tls.pair())
  const expired = tls && certificateExpiry(tls.pair())
  if (expired) logger.error({ ...config.server.tls, validTo: tls.pair().validTo.toISOString() }, `TLS certificate in force: ${expired}`)
  const databaseUrl = databaseUrlFromEnv()
  const internalToken = internalTokenFromEnv()
  warnOfPublishedToken(internalToken, logger)
  const ordersToken = config.upstreams.orders ? ordersTokenFromEnv() : undefined
  const drainMillis = drainMillisFromEnv()

  const poolSize = poolSizeFromEnv()
  const pool = createPool({ connectionString: databaseUrl, applicationName: 'gateway', max: poolSize, logger })
  registerPoolMetrics(registry, pool)
  const postgresRefusals = watchPostgresRefusals(pool, GATEWAY_POSTGRES_NEEDS, logger)
  const limiter = createLimiter({ config: configSource.get, logger, observer: metrics.store })
  // The ops port first: while Postgres is awaited the process is alive (/healthz) and not ready.
  let started = false
  let accepting = true
  const ops = buildOpsServer({
    registry,
    logger,
    isStarted: () => started,
    isAccepting: () => accepting,
    dependencies: {
      // Once started, a check of what requests need, not SELECT 1: a privilege taken from the role
      // leaves Postgres answering while every key lookup is refused. Before, the schema may not exist yet.
      postgres: async () => void (started ? await postgresRefusals.probe() : await postgresAnswers(pool)),
      // Authenticated: a pets-service refusing this gateway's INTERNAL_TOKEN is not a ready upstream.
      upstream: upstreamAcceptsGateway(config.upstreams.pets.url, internalToken),
      // With onStoreFailure "closed" a gateway whose Redis cannot decide (disconnected, frozen,
      // slow past the budget, out of memory) answers every request 503, so it is not ready: the
      // probe is a real decision, not a look at the connection. With "open" it serves on
      // per-process limits, and Redis is left out of readiness (its errors show in
      // gateway_rate_limit_store_errors_total and the RateLimitStoreErrors alert).
      ...(limiter.storeKind !== 'memory' && config.onStoreFailure === 'closed'
        ? { redis: () => limiter.probe().catch((error: unknown) => { throw new DependencyDown(firstLine(error)) }) }
        : {}),
    },
  })
  await listenOrSay(() => ops.listen({ host: config.server.opsHost, port: config.server.opsPort }), {
    host: config.server.opsHost,
    port: config.server.opsPort,
    hostSetting: 'GATEWAY_OPS_HOST (server.opsHost)',
    portSetting: 'GATEWAY_OPS_PORT (server.opsPort)',
  })

  await waitForPostgres(pool, logger)
  await requireUtf8Database(pool)
  await requirePostgresGrants(pool, GATEWAY_POSTGRES_NEEDS, () => migrate(pool, GATEWAY_MIGRATIONS, logger))
  const redisReady = await limiter.ready()
  // A Redis that is down may come back, and the gateway starts meanwhile; one that refuses the
  // credentials will not by itself: started anyway, the gateway would silently keep per-process
  // limits (open) or answer 503 (closed) until someone read its warning. On a Cluster that is
  // ready, one master alone may refuse them (ACLs are per node), with the same effect on its keys.
  const redisVariable = limiter.storeKind === 'cluster' ? 'REDIS_CLUSTER_NODES' : 'REDIS_URL'
  const refused = limiter.credentialsRefused()
  if (refused !== undefined) {
    throw new EnvError(`cannot use Redis at ${redisVariable}: it refuses the gateway's credentials (${refused}); fix ${redisCredentialVariables(limiter.storeKind)}`)
  }
  // So does an ACL user that logs in but may not run the scripts or touch the keys: every
  // decision would fail the same way, for good. Only Redis's refusal stops the start; a check
  // that fails otherwise (Redis down, slow, out of memory) may mend, and requests will tell.
  const forbidden = await limiter.permissionsRefused()
  if (forbidden !== undefined) {
    throw new EnvError(`cannot use Redis at ${redisVariable}: it refuses the gateway a command or key it needs (${forbidden}); ${redisAclFix(limiter.storeKind, config.redis.keyPrefix)}`)
  }
  if (!redisReady) logger.warn({ problem: limiter.connectionProblem() }, 'Redis is not reachable yet; limits follow onStoreFailure until it is')
  else {
    const evicting = await limiter.evictingServers()
    if (evicting.length > 0) {
      logger.warn(
        { maxmemoryPolicy: evicting },
        `Redis at ${redisVariable} evicts keys when full (maxmemory-policy ${evicting.join(', ')}): counts, strikes and bans then vanish, ` +
          'and keys over their limits are admitted again; set maxmemory-policy noeviction, so that a full Redis refuses writes, answered per onStoreFailure',
      )
    }
  }
  const { app, repository, changes, unbans } = await wireGateway({
    config: configSource.get,
    pool,
    databaseUrl,
    postgresRefusals,
    limiter,
    metrics,
    registry,
    internalToken,
    ordersToken,
    logger,
    tls: tls?.pair(),
  })
  capConnections(app.server, connectionBudget({
    configured: config.server.maxConnections,
    // The pool, the change feed's LISTEN connection, and each upstream's connection pool.
    outboundConnections: poolSize + 1 + UPSTREAM_CONNECTIONS * Object.keys(config.upstreams).length,
    openFileLimit: openFileLimit(),
  }), logger, 'server.maxConnections (GATEWAY_MAX_CONNECTIONS)')
  registerConnectionMetrics(registry, { public: app.server, ops: ops.server })
  const stopPurge = purgeHourly('key changes and ban records past a day', () => repository.purgeChanges(), logger)
  checkKeysWithoutLimits = (inForce) => void warnOfKeysWithoutLimits(repository, inForce, logger)
  checkKeysWithoutLimits(configSource.get())
  const stopWatching = configSource.watch()
  // app.server is an https.Server when tls is set (buildGateway).
  const stopTlsWatch = tls?.watch(app.server as unknown as TlsServer) ?? (() => {})
  // Ahead of the HTTPS server's own listener, which destroys the socket (and with it its address).
  if (tls) {
    app.server.prependListener('connection', rememberClientAddress)
    app.server.prependListener('tlsClientError', reportHandshakeFailures(logger, tlsMetrics?.handshakeFailure))
  }
  process.off('SIGHUP', holdReload)
  if (reloadHeld) {
    configSource.reload()
    tls?.reload()
  }
  await listenOrSay(() => app.listen({ host: config.server.host, port: config.server.port }), {
    host: config.server.host,
    port: config.server.port,
    hostSetting: 'GATEWAY_HOST (server.host)',
    portSetting: 'GATEWAY_PORT (server.port)',
  })
  started = true

  onShutdownSignal(logger, [
    { name: 'stop accepting', run: async () => (accepting = false) },
    { name: 'drain connections', run: () => app.drain(drainMillis) },
    { name: 'drain requests', run: () => app.close() },
    { name: 'stop key change feed', run: () => changes.stop(), boundMillis: CLOSE_DEPENDENCY_MILLIS },
    { name: 'stop applying unbans', run: () => unbans.stop(), boundMillis: CLOSE_DEPENDENCY_MILLIS },
    { name: 'stop purging', run: async () => stopPurge() },
    { name: 'stop config watch', run: async () => (process.on('SIGHUP', holdReload), stopWatching(), stopTlsWatch()) },
    { name: 'close rate-limit store', run: () => limiter.close(), boundMillis: CLOSE_DEPENDENCY_MILLIS },
    { name: 'close ops port', run: () => ops.close() },
    { name: 'close Postgres pool', run: () => pool.end(), boundMillis: CLOSE_DEPENDENCY_MILLIS },
  ], { npmScript: 'start:gateway', replaces: stopStartWatch, deadlineMillis: drainMillis + shutdownAfterDrainMillis(config.upstreams) })
}

/** Redis's own words for the operator (`OOM command not allowed …`, `Redis did not answer within 50 ms`). */
function firstLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0]!.slice(0, 200)
}

main().catch((error: unknown) => {
  if (error instanceof ConfigError) {
    logger.fatal({ problems: error.problems }, 'gateway config is invalid')
    console.error(error.message)
  } else {
    reportStartupFailure(logger, 'gateway', error)
  }
  process.exit(1)
})
