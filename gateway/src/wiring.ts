import type { FastifyInstance } from 'fastify'
import type pg from 'pg'
import type { Logger } from 'pino'
import type { Registry } from 'prom-client'
import type { ClientTimeouts } from '../../common/src/http/clientErrors.ts'
import type { PostgresRefusalWatch } from '../../common/src/database/privileges.ts'
import { buildGateway } from './app.ts'
import type { GatewayConfig } from './config/loadConfig.ts'
import type { TlsPair } from './config/tlsFiles.ts'
import { createUnbanApplier, keyChangeHandler } from './keys/applyKeyChange.ts'
import { createKeyCache, type KeyCache } from './keys/keyCache.ts'
import { startKeyChangeFeed } from './keys/keyChangeFeed.ts'
import { createKeyRepository, type KeyRepository } from './keys/keyRepository.ts'
import type { GatewayMetrics } from './metrics/gatewayMetrics.ts'
import { banJournal } from './rateLimit/banJournal.ts'
import type { Limiter } from './rateLimit/limiter.ts'

export interface GatewayParts {
  app: FastifyInstance
  repository: KeyRepository
  cache: KeyCache
  /** Key changes and unbans from Postgres, applied to the cache and the limiter; stopped at shutdown. */
  changes: { stop(): Promise<void> }
  unbans: ReturnType<typeof createUnbanApplier>
}

/**
 * The gateway's parts on a migrated database, wired as the process runs them: the key cache fed
 * by the change feed, unbans applied to the limiter, bans recorded for the CLI, metrics observing
 * the cache, the bans and the store, then the request pipeline (app.ts). main.ts adds the process
 * around it (config source, ops port, purge, listen, shutdown); the tests' gateways use it as is.
 */
export async function wireGateway(options: {
  config: () => GatewayConfig
  pool: pg.Pool
  databaseUrl: string
  /** Says a Postgres refusal once per episode (main.ts); without it, each refused lookup has its error line. */
  postgresRefusals?: PostgresRefusalWatch
  limiter: Limiter
  metrics: GatewayMetrics
  registry: Registry
  internalToken: string
  ordersToken?: string
  logger: Logger
  clientTimeouts?: ClientTimeouts
  /** HTTPS on the public port with this pair (server.tls); plain HTTP without. */
  tls?: TlsPair
}): Promise<GatewayParts> {
  const { limiter, metrics, logger } = options
  const repository = createKeyRepository(options.pool)
  const cache = createKeyCache(repository, options.config().keyCache)
  const unbans = createUnbanApplier({ repository, limiter, logger })
  const changes = await startKeyChangeFeed({
    repository,
    connectionString: options.databaseUrl,
    onChange: keyChangeHandler(cache, unbans),
    onRewound: () => cache.clear(),
    logger,
  })
  unbans.start()
  metrics.observeKeyCache(cache)
  metrics.observeBans(limiter.bans)
  metrics.store.expect(limiter.storeKind)
  const app = await buildGateway({
    config: options.config,
    keys: cache,
    limiter,
    metrics,
    onNewBan: banJournal({ record: repository.recordBan, logger }),
    internalToken: options.internalToken,
    ordersToken: options.ordersToken,
    logger,
    registry: options.registry,
    clientTimeouts: options.clientTimeouts,
    tls: options.tls,
    postgresRefusals: options.postgresRefusals,
  })
  return { app, repository, cache, changes, unbans }
}
