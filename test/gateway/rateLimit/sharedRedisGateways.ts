import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { startRedisCluster, type TestCluster } from '../../helpers/redis.ts'
import { startPrivateRedis, type PrivateRedis } from '../../helpers/redisServer.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS } from './httpLimits.ts'

export interface SharedRedisGateways {
  pets: RunningPetsService
  redis: PrivateRedis
  a: RunningGateway
  b: RunningGateway
  /** Thaws Redis if frozen, then stops everything. */
  close(): Promise<void>
}

interface SharingOptions {
  prefix: string
  ladder: string[]
  logStreams?: [NodeJS.WritableStream?, NodeJS.WritableStream?]
}

/**
 * A pets-service, a private Redis, and two gateways on it under one key prefix, with a 2 s minute
 * window (strikes count within it: a lifted or forgotten ban leaves a clear window soon) and the
 * given ban ladder, 3 strikes to a ban: the ban tests' setting.
 */
export async function startGatewaysSharingRedis(databaseUrl: string, options: SharingOptions): Promise<SharedRedisGateways> {
  const redis = await startPrivateRedis()
  const gateways = await startTwoGateways(databaseUrl, { REDIS_URL: redis.url }, options)
  return {
    ...gateways,
    redis,
    async close() {
      redis.thaw()
      await gateways.close()
      await redis.close()
    },
  }
}

/** The same on a three-master Redis Cluster of their own. */
export async function startGatewaysSharingCluster(
  databaseUrl: string,
  options: SharingOptions,
): Promise<Omit<SharedRedisGateways, 'redis'> & { cluster: TestCluster }> {
  const cluster = await startRedisCluster()
  const gateways = await startTwoGateways(databaseUrl, { REDIS_CLUSTER_NODES: cluster.nodes.join(',') }, options)
  return {
    ...gateways,
    cluster,
    async close() {
      await gateways.close()
      await cluster.close()
    },
  }
}

async function startTwoGateways(databaseUrl: string, env: NodeJS.ProcessEnv, options: SharingOptions) {
  const pets = await startPetsService(databaseUrl)
  const gateway = (logStream: NodeJS.WritableStream | undefined) =>
    startGateway({
      databaseUrl,
      petsUrl: pets.url,
      env,
      ...(logStream ? { logStream } : {}),
      configure: (file) => {
        file.redis.keyPrefix = options.prefix
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
        file.windows.minute = { length: '2s', bucket: '1s' }
        file.bans = { strikes: 3, ladder: options.ladder }
      },
    })
  const a = await gateway(options.logStreams?.[0])
  const b = await gateway(options.logStreams?.[1])
  return {
    pets,
    a,
    b,
    async close() {
      await a.close()
      await b.close()
      await pets.close()
    },
  }
}
