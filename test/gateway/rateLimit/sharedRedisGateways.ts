import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
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

/**
 * A pets-service, a private Redis, and two gateways on it under one key prefix, with a 2 s minute
 * window (strikes count within it: a lifted or forgotten ban leaves a clear window soon) and the
 * given ban ladder, 3 strikes to a ban: the ban tests' setting.
 */
export async function startGatewaysSharingRedis(
  databaseUrl: string,
  options: { prefix: string; ladder: string[]; logStreams?: [NodeJS.WritableStream?, NodeJS.WritableStream?] },
): Promise<SharedRedisGateways> {
  const pets = await startPetsService(databaseUrl)
  const redis = await startPrivateRedis()
  const gateway = (logStream: NodeJS.WritableStream | undefined) =>
    startGateway({
      databaseUrl,
      petsUrl: pets.url,
      env: { REDIS_URL: redis.url },
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
    redis,
    a,
    b,
    async close() {
      redis.thaw()
      await a.close()
      await b.close()
      await pets.close()
      await redis.close()
    },
  }
}
