import { readFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import { pino } from 'pino'
import type pg from 'pg'
import { Registry } from 'prom-client'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { buildGateway } from '../../gateway/src/app.ts'
import { parseGatewayConfig, resolveGatewayConfig, type GatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { createKeyCache, type KeyCache } from '../../gateway/src/keys/keyCache.ts'
import { startKeyChangeFeed } from '../../gateway/src/keys/keyChangeFeed.ts'
import { createKeyRepository, type KeyRepository, type NewApiKey } from '../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { TEST_INTERNAL_TOKEN } from './petsService.ts'

export interface GatewayOptions {
  databaseUrl: string
  /** Where the pets upstream listens. */
  petsUrl: string
  /** Adjusts the repository's config/gateway.yaml before it is resolved. */
  configure?: (file: GatewayConfigFile) => void
  logStream?: NodeJS.WritableStream
}

export interface RunningGateway {
  app: FastifyInstance
  url: string
  config: GatewayConfig
  pool: pg.Pool
  keys: KeyRepository
  cache: KeyCache
  /** Issues a key through the same repository the CLI uses and returns its plaintext. */
  createKey(input?: Partial<NewApiKey>): Promise<{ id: string; key: string }>
  request(pathAndQuery: string, init?: RequestInit & { key?: string }): Promise<Response>
  close(): Promise<void>
}

export function testGatewayConfig(petsUrl: string, configure?: (file: GatewayConfigFile) => void): GatewayConfig {
  const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
  configure?.(file)
  return resolveGatewayConfig(file, { PETS_URL: petsUrl })
}

/** A real gateway on an ephemeral port, with its own key cache and change feed. */
export async function startGateway(options: GatewayOptions): Promise<RunningGateway> {
  const config = testGatewayConfig(options.petsUrl, options.configure)
  const pool = createPool({ connectionString: options.databaseUrl, applicationName: 'gateway-test' })
  await migrate(pool, GATEWAY_MIGRATIONS)
  const logger = options.logStream ? pino(options.logStream) : pino({ level: 'silent' })
  const keys = createKeyRepository(pool)
  const cache = createKeyCache(keys, config.keyCache)
  const feed = await startKeyChangeFeed({
    repository: keys,
    connectionString: options.databaseUrl,
    onChange: (hash) => cache.invalidate(hash),
    logger,
  })
  const app = await buildGateway({ config, keys: cache, internalToken: TEST_INTERNAL_TOKEN, logger, registry: new Registry() })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  return {
    app,
    url,
    config,
    pool,
    keys,
    cache,
    async createKey(input = {}) {
      const { record, key } = await keys.create({ name: 'test', plan: 'free', ...input })
      return { id: record.id, key }
    },
    request(pathAndQuery, init = {}) {
      const { key, ...rest } = init
      const headers = new Headers(rest.headers)
      if (key !== undefined) headers.set('authorization', `Bearer ${key}`)
      return fetch(`${url}${pathAndQuery}`, { ...rest, headers })
    },
    async close() {
      await app.close()
      await feed.stop()
      await pool.end()
    },
  }
}
