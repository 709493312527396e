import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { captureLog } from '../../helpers/logCapture.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { testKeyPrefix } from '../../helpers/redis.ts'
import { startPrivateRedis, type PrivateRedis } from '../../helpers/redisServer.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, codeOf, eventually } from './httpLimits.ts'

// README, Redis persistence: a Redis that comes back empty has forgotten every ban. A gateway
// that held a ban in its cache went on refusing the key until the ban's end (a minute here, up to
// a day), while the gateways that had not seen it admitted the key.
describe('bans after Redis restarts empty, on two gateways that share it', () => {
  const database = suiteDatabase()
  const prefix = testKeyPrefix()
  let pets: RunningPetsService
  let redis: PrivateRedis
  let a: RunningGateway
  let b: RunningGateway
  const aLog = captureLog()

  beforeAll(async () => {
    pets = await startPetsService(database.url)
    redis = await startPrivateRedis()
    const options = {
      databaseUrl: database.url,
      petsUrl: pets.url,
      env: { REDIS_URL: redis.url },
      configure: (file: Parameters<NonNullable<Parameters<typeof startGateway>[0]['configure']>>[0]) => {
        file.redis.keyPrefix = prefix
        file.redis.commandTimeoutMillis = EXACT_OUTCOME_BUDGET_MILLIS
        file.windows.minute = { length: '2s', bucket: '1s' }
        file.bans = { strikes: 3, ladder: ['60s'] }
      },
    }
    a = await startGateway({ ...options, logStream: aLog.stream })
    b = await startGateway(options)
  })
  afterAll(async () => {
    await a?.close()
    await b?.close()
    await pets?.close()
    await redis?.close()
  })

  it('asks the new server again about the bans it held: both gateways admit the key the empty Redis no longer bans', async () => {
    const { key } = await a.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    const codes: (string | undefined)[] = []
    while (codes.length < 10 && codes.at(-1) !== 'api_key_banned') codes.push(await codeOf(await send(a)))
    expect(codes).toEqual([undefined, undefined, 'rate_limited', 'rate_limited', 'api_key_banned'])
    // Both gateways hold the ban in their caches now.
    for (const gateway of [a, b]) expect(await codeOf(await send(gateway))).toBe('api_key_banned')
    const banned = performance.now()
    await redis.restart()
    for (const gateway of [a, b]) {
      await eventually(async () => (await codeOf(await send(gateway))) === undefined, 20_000, 200)
    }
    // Long before the ban's 60 s were over.
    expect(performance.now() - banned).toBeLessThan(30_000)
    expect(aLog.entries().filter((entry) => typeof entry.msg === 'string' && entry.msg.startsWith('Redis is another server than before'))).toHaveLength(1)
  })
})
