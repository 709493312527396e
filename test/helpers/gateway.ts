import { readFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import { pino } from 'pino'
import { expect, vi } from 'vitest'
import type { ClientTimeouts } from '../../common/src/http/clientErrors.ts'
import type pg from 'pg'
import { Registry } from 'prom-client'
import { collectProcessMetrics } from '../../common/src/ops/processMetrics.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { watchPostgresRefusals } from '../../common/src/database/privileges.ts'
import { registerPoolMetrics } from '../../common/src/ops/poolMetrics.ts'
import { hashApiKeyHex } from '../../gateway/src/keys/apiKeyFormat.ts'
import { parseGatewayConfig, resolveGatewayConfig, type GatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import type { TlsPair } from '../../gateway/src/config/tlsFiles.ts'
import type { KeyCache } from '../../gateway/src/keys/keyCache.ts'
import type { KeyRepository, NewApiKey } from '../../gateway/src/keys/keyRepository.ts'
import { createGatewayMetrics } from '../../gateway/src/metrics/gatewayMetrics.ts'
import { GATEWAY_MIGRATIONS, GATEWAY_POSTGRES_NEEDS } from '../../gateway/src/migrations.ts'
import { createLimiter, type Limiter } from '../../gateway/src/rateLimit/limiter.ts'
import { wireGateway } from '../../gateway/src/wiring.ts'
import { contractFetch, type ContractOptions } from './contract.ts'
import { TEST_INTERNAL_TOKEN } from './petsService.ts'

export interface GatewayOptions {
  databaseUrl: string
  /** Where the pets upstream listens. */
  petsUrl: string
  /** Adjusts the repository's config/gateway.yaml before it is resolved. */
  configure?: (file: GatewayConfigFile) => void
  logStream?: NodeJS.WritableStream
  /** Environment the config is resolved with (REDIS_URL, …); PETS_URL is set from petsUrl. */
  env?: NodeJS.ProcessEnv
  /** Local clock for the ban cache (a skewed gateway in the tests). */
  clock?: () => number
  /** Shorter header and request timeouts, so slow-client tests need not wait 10 s and 30 s. */
  clientTimeouts?: ClientTimeouts
  /** The credential the gateway sends upstream; the pets-service's own by default. */
  internalToken?: string
  /** What an orders upstream (upstreams.orders) gets; TEST_ORDERS_TOKEN unless set. */
  ordersToken?: string
  /** HTTPS on its port with this pair (the url is then https://; `request` is for plain HTTP only). */
  tls?: TlsPair
}

export interface RunningGateway {
  app: FastifyInstance
  url: string
  config: GatewayConfig
  pool: pg.Pool
  keys: KeyRepository
  cache: KeyCache
  limiter: Limiter
  /** The gateway's metrics, as its ops port would serve them. */
  registry: Registry
  /** Issues a key through the same repository the CLI uses and returns its plaintext. */
  createKey(input?: Partial<NewApiKey>): Promise<{ id: string; key: string }>
  /**
   * Resolves once this gateway's change feed has delivered a change of each key (its creation,
   * for a key just made) and dropped it from the cache: from then on a lookup is the one kept.
   */
  announced(...keys: string[]): Promise<void>
  /**
   * fetch against the gateway, `key` sent as the bearer token. Every response is checked against
   * the OpenAPI document (test/helpers/contract.ts) and a departure throws; `contract: false` is
   * for tests that deliberately make the system answer outside it (a fake upstream's garbage).
   */
  request(pathAndQuery: string, init?: RequestInit & { key?: string } & ContractOptions): Promise<Response>
  close(): Promise<void>
}

/** ORDERS_INTERNAL_TOKEN of the tests' gateways. */
export const TEST_ORDERS_TOKEN = 'test-orders-token-0123456789abcdef'

export function testGatewayConfig(
  petsUrl: string,
  configure?: (file: GatewayConfigFile) => void,
  env: NodeJS.ProcessEnv = {},
): GatewayConfig {
  const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
  // Every test client is 127.0.0.1; tests of the anonymous limit set their own.
  file.anonymous.perMinute = 100_000
  configure?.(file)
  return resolveGatewayConfig(file, { ...env, PETS_URL: petsUrl })
}

/** A real gateway on an ephemeral port, with its own key cache and change feed. */
export async function startGateway(options: GatewayOptions): Promise<RunningGateway> {
  const config = testGatewayConfig(options.petsUrl, options.configure, options.env)
  const pool = createPool({ connectionString: options.databaseUrl, applicationName: 'gateway-test' })
  await migrate(pool, GATEWAY_MIGRATIONS)
  const logger = options.logStream ? pino(options.logStream) : pino({ level: 'silent' })
  const registry = new Registry()
  const metrics = createGatewayMetrics(registry)
  metrics.expectBanSteps(config.bans.ladderSeconds.length)
  registerPoolMetrics(registry, pool)
  collectProcessMetrics(registry)
  const limiter = createLimiter({ config: () => config, logger, clock: options.clock, observer: metrics.store })
  await limiter.ready()
  // The gateway's own wiring (gateway/src/wiring.ts), as its process runs it.
  const { app, repository: keys, cache, changes: feed, unbans } = await wireGateway({
    config: () => config,
    pool,
    databaseUrl: options.databaseUrl,
    limiter,
    metrics,
    registry,
    internalToken: options.internalToken ?? TEST_INTERNAL_TOKEN,
    ordersToken: options.ordersToken ?? TEST_ORDERS_TOKEN,
    logger,
    clientTimeouts: options.clientTimeouts,
    tls: options.tls,
    // As main.ts has it: Postgres refusing the role, or unavailable, said once per episode or minute.
    postgresRefusals: watchPostgresRefusals(pool, GATEWAY_POSTGRES_NEEDS, logger),
  })
  const invalidated = new Set<string>()
  const invalidate = cache.invalidate
  cache.invalidate = (keyHash) => {
    invalidated.add(keyHash.toString('hex'))
    invalidate(keyHash)
  }
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `${options.tls ? 'https' : 'http'}://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  return {
    app,
    url,
    config,
    pool,
    keys,
    cache,
    limiter,
    registry,
    async createKey(input = {}) {
      const { record, key } = await keys.create({ name: 'test', plan: 'free', ...input })
      return { id: record.id, key }
    },
    async announced(...plaintexts) {
      // NOTIFY usually brings a change at once; the periodic read (1 s) is its bound, later on a loaded machine.
      await vi.waitFor(() => expect(plaintexts.filter((key) => !invalidated.has(hashApiKeyHex(key)))).toEqual([]), { timeout: 10_000, interval: 20 })
    },
    request(pathAndQuery, init = {}) {
      const { key, ...rest } = init
      const headers = new Headers(rest.headers)
      if (key !== undefined) headers.set('authorization', `Bearer ${key}`)
      return contractFetch(`${url}${pathAndQuery}`, { ...rest, headers })
    },
    async close() {
      await app.close()
      await feed.stop()
      await unbans.stop()
      await limiter.close()
      await pool.end()
    },
  }
}
