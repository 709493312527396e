import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { RunningGateway } from '../../helpers/gateway.ts'
import { captureLog } from '../../helpers/logCapture.ts'
import { testKeyPrefix } from '../../helpers/redis.ts'
import type { PrivateRedis } from '../../helpers/redisServer.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { codeOf, eventually } from './httpLimits.ts'
import { Redis } from 'ioredis'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { startGatewaysSharingCluster, startGatewaysSharingRedis, type SharedRedisGateways } from './sharedRedisGateways.ts'

// README, Redis persistence: a Redis that comes back empty has forgotten every ban. A gateway
// that held a ban in its cache went on refusing the key until the ban's end (a minute here, up to
// a day), while the gateways that had not seen it admitted the key.
describe('bans after Redis restarts empty, on two gateways that share it', () => {
  const database = suiteDatabase()
  const aLog = captureLog()
  let shared: SharedRedisGateways | undefined
  let redis: PrivateRedis
  let a: RunningGateway
  let b: RunningGateway

  beforeAll(async () => {
    shared = await startGatewaysSharingRedis(database.url, { prefix: testKeyPrefix(), ladder: ['60s'], logStreams: [aLog.stream] })
    ;({ redis, a, b } = shared)
  })
  afterAll(async () => {
    await shared?.close()
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

// A Cluster client is ready once, as a whole: a master restarted alone went unnoticed, and the
// gateway that had cached a ban kept refusing the key until its end while the other admitted it.
describe('bans after one master of a Redis Cluster restarts empty, on two gateways that share the cluster', () => {
  const database = suiteDatabase()
  const aLog = captureLog()
  const prefix = testKeyPrefix()
  let shared: Awaited<ReturnType<typeof startGatewaysSharingCluster>> | undefined

  beforeAll(async () => {
    shared = await startGatewaysSharingCluster(database.url, { prefix, ladder: ['60s'], logStreams: [aLog.stream] })
  })
  afterAll(async () => {
    await shared?.close()
  })

  it('asks the restarted master again about the bans it held: both gateways admit the key it no longer bans', async () => {
    const { a, b, cluster } = shared!
    const { id, key } = await a.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    const codes: (string | undefined)[] = []
    while (codes.length < 10 && codes.at(-1) !== 'api_key_banned') codes.push(await codeOf(await send(a)))
    expect(codes).toEqual([undefined, undefined, 'rate_limited', 'rate_limited', 'api_key_banned'])
    for (const gateway of [a, b]) expect(await codeOf(await send(gateway))).toBe('api_key_banned')
    // The master that holds the key's state: the others redirect (MOVED) instead of answering.
    const holders: string[] = []
    for (const node of cluster.nodes) {
      const admin = new Redis(Number(node.split(':')[1]), '127.0.0.1', { lazyConnect: true })
      if ((await admin.exists(`${prefix}${limitKey(id)}`).catch(() => 0)) === 1) holders.push(node)
      admin.disconnect()
    }
    expect(holders).toHaveLength(1)
    const banned = performance.now()
    await cluster.restart(holders[0]!)
    for (const gateway of [a, b]) {
      await eventually(async () => (await codeOf(await send(gateway))) === undefined, 20_000, 200)
    }
    // Long before the ban's 60 s were over.
    expect(performance.now() - banned).toBeLessThan(30_000)
    expect(aLog.entries().some((entry) => typeof entry.msg === 'string' && entry.msg.startsWith('Redis is another server than before'))).toBe(true)
  }, 60_000)
})
