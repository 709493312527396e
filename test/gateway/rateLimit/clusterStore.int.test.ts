import { Cluster } from 'ioredis'
import { connectRedis, createRedisStore, redisReady } from '../../../gateway/src/rateLimit/redisStore.ts'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { startRedisCluster } from '../../helpers/redis.ts'
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
