import { Cluster } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { connectRedis, createRedisStore, redisReady } from '../../../gateway/src/rateLimit/redisStore.ts'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { startRedisCluster, type TestCluster } from '../../helpers/redis.ts'
import { describeLimitStore } from './store.suite.ts'

describeLimitStore('Redis Cluster (three masters)', async () => {
  const cluster = await startRedisCluster()
  const client = connectRedis({ clusterNodes: cluster.nodes, keyPrefix: 'aas-test:', commandTimeoutMillis: 1_000 })
  if (!(await redisReady(client))) throw new Error('Redis did not become ready')
  const admin = new Cluster(cluster.nodes.map((node) => ({ host: '127.0.0.1', port: Number(node.split(':')[1]) })))
  admin.on('error', () => undefined)
  return {
    store: createRedisStore(client),
    async inspect(keyId) {
      const key = `aas-test:${limitKey(keyId)}`
      return { pttl: await admin.pttl(key), bytes: Number(await admin.call('MEMORY', 'USAGE', key)) }
    },
    async close() {
      client.disconnect()
      admin.disconnect()
      await cluster.stop()
    },
  }
})

// REDIS_CLUSTER_NODES may name only some masters (seeds). Regression: the ready check asked a
// master the client had only just found, before its connection was up; with no offline queue that
// failed, and the client started over from the seeds, for up to 10 s of starts on the fallback.
describe('Redis Cluster seeds', () => {
  let cluster: TestCluster
  beforeAll(async () => {
    cluster = await startRedisCluster()
  })
  afterAll(async () => {
    await cluster?.stop()
  })

  it.each([
    ['one seed of three masters', () => [cluster.nodes[1]!]],
    ['a seed that is down, then a live one', () => ['127.0.0.1:1', cluster.nodes[1]!]],
  ])('%s: the client is ready on every start without starting over', async (_case, seeds) => {
    const starts: { ready: boolean; reconnects: number }[] = []
    for (let attempt = 0; attempt < 8; attempt++) {
      const client = connectRedis({ clusterNodes: seeds(), keyPrefix: 'aas-test:', commandTimeoutMillis: 50 })
      let reconnects = 0
      client.on('reconnecting', () => reconnects++)
      starts.push({ ready: await redisReady(client, 15_000), reconnects })
      client.disconnect()
    }
    expect(starts).toEqual(starts.map(() => ({ ready: true, reconnects: 0 })))
  }, 150_000)
})
