import { Redis } from 'ioredis'
import { connectRedis, createRedisStore, redisReady } from '../../../gateway/src/rateLimit/redisStore.ts'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { TEST_REDIS_URL, deleteKeysWithPrefix, testKeyPrefix } from '../../helpers/redis.ts'
import { describeLimitStore } from './store.suite.ts'

describeLimitStore('single Redis', async () => {
  const keyPrefix = testKeyPrefix()
  const client = connectRedis({ url: TEST_REDIS_URL, keyPrefix, commandTimeoutMillis: 1_000 })
  if (!(await redisReady(client))) throw new Error('Redis did not become ready')
  const admin = new Redis(TEST_REDIS_URL)
  return {
    store: createRedisStore(client),
    async inspect(keyId) {
      const key = keyPrefix + limitKey(keyId)
      return { pttl: await admin.pttl(key), bytes: Number(await admin.memory('USAGE', key)) }
    },
    async close() {
      client.disconnect()
      admin.disconnect()
      await deleteKeysWithPrefix(keyPrefix)
    },
  }
})
