import type { Socket } from 'node:net'
import { Redis } from 'ioredis'
import { describe, expect, it } from 'vitest'
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

describe('Redis writes', () => {
  it('sends the decisions of requests that arrive in one event-loop turn in one socket write, each answered on its own', async () => {
    const keyPrefix = testKeyPrefix()
    const client = connectRedis({ url: TEST_REDIS_URL, keyPrefix, commandTimeoutMillis: 1_000 })
    try {
      if (!(await redisReady(client))) throw new Error('Redis did not become ready')
      const store = createRedisStore(client)
      const socket = (client as Redis).stream as Socket & { _write: Socket['_write']; _writev: NonNullable<Socket['_writev']> }
      let writes = 0
      const [write, writev] = [socket._write.bind(socket), socket._writev.bind(socket)]
      socket._write = (...args) => (writes++, write(...args))
      socket._writev = (...args) => (writes++, writev(...args))

      const keyId = `key_${Date.now()}`
      const minute = { limit: 30, windowMillis: 60_000, bucketMillis: 5_000 }
      const day = { limit: 1_000, windowMillis: 86_400_000, bucketMillis: 3_600_000 }
      const bans = { strikes: 1_000, strikeWindowMillis: 60_000, ladderMillis: [60_000], memoryMillis: 86_400_000 }
      const decisions = await Promise.all(Array.from({ length: 50 }, () => store.consume({ keyId, minute, day, bans })))

      expect(writes).toBe(1)
      expect(decisions.filter((decision) => decision.outcome === 'admitted')).toHaveLength(30)
      expect(decisions.filter((decision) => decision.outcome === 'limited')).toHaveLength(20)
      expect(decisions.map((decision) => decision.minute.remaining).sort((a, b) => b - a).slice(0, 30)).toEqual(
        Array.from({ length: 30 }, (_, i) => 29 - i),
      )
    } finally {
      client.disconnect()
      await deleteKeysWithPrefix(keyPrefix)
    }
  })
})
