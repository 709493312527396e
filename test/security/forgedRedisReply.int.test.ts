import type pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../helpers/redis.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { eventually, sleep } from '../gateway/rateLimit/httpLimits.ts'
import { startGatewayProcess } from '../ops/gatewayProcess.ts'
import { killAll } from '../scripts/processes.ts'

/**
 * A reply nested 10,000 arrays deep (`*1\r\n` … `:1\r\n`, 40 KB): a parser that recurses per level
 * runs out of stack on it. From a compromised Redis, or on-path on a cleartext connection.
 */
const NESTED_REPLY = Buffer.from(`${'*1\r\n'.repeat(10_000)}:1\r\n`)

describe('a Redis reply forged on the wire', () => {
  const prefix = suiteKeyPrefix()
  const database = suiteDatabase()
  let upstream: TestUpstream
  let pool: pg.Pool

  beforeAll(async () => {
    upstream = await recordingUpstream()
    pool = createPool({ connectionString: database.url, applicationName: 'forged-redis-reply-test', max: 2 })
  })
  afterAll(async () => {
    await killAll()
    await pool?.end()
    await upstream?.close()
  })

  // ioredis 5's parser (redis/ioredis#2108) threw RangeError: Maximum call stack size exceeded
  // out of the socket's 'data' listener, uncaught: the gateway process died at the first such reply.
  it('nested 10,000 arrays deep: the gateway keeps running, answers per onStoreFailure (closed: 503), and decides in Redis again once the replies are Redis\'s', async () => {
    const target = new URL(TEST_REDIS_URL)
    const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 6379) })
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_URL: `redis://127.0.0.1:${relay.port}` },
      configure: (file) => {
        file.redis.keyPrefix = prefix
        file.onStoreFailure = 'closed'
      },
      readyTimeoutMillis: 30_000,
    })
    try {
      const { key } = await createKeyRepository(pool).create({ name: 'forged-redis-reply', plan: 'free' })
      const request = async () => {
        try {
          const response = await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` }, signal: AbortSignal.timeout(5_000) })
          await response.arrayBuffer()
          return response.status
        } catch (error) {
          return `no answer (${(error as Error & { cause?: { code?: string } }).cause?.code ?? String(error)})`
        }
      }
      expect(await request()).toBe(200)

      await relay.forge(NESTED_REPLY)
      const whileForged = []
      for (let i = 0; i < 5; i++) {
        whileForged.push(await request())
        await sleep(200)
      }
      expect(gateway.proc.hasExited(), `the gateway exited:\n${gateway.proc.output().slice(-3_000)}`).toBe(false)
      expect(whileForged).toEqual([503, 503, 503, 503, 503])
      expect((await fetch(`${gateway.opsUrl}/healthz`)).status).toBe(200)
      expect((await gateway.readyz()).status).toBe(503)

      await relay.restore()
      const recoveredMillis = await eventually(async () => (await gateway.readyz()).status === 200, 10_000)
      expect(await request()).toBe(200)
      expect(gateway.proc.hasExited()).toBe(false)
      recordScenario({
        area: 'Hostile input',
        scenario: 'Redis replies forged on the wire (a cleartext connection): each reply replaced by an array nested 10,000 deep',
        answered: `the gateway kept running: 5 of 5 keyed requests answered 503 (onStoreFailure closed) meanwhile, /healthz 200; ready again ${Math.round(recoveredMillis)} ms after the replies were Redis's, then 200`,
        lost: 'nothing: no process exit; the forged replies were refused as protocol errors and their connections dropped',
        test: 'test/security/forgedRedisReply.int.test.ts',
      })
    } finally {
      gateway.proc.kill()
      gateway.cleanup()
      await relay.close()
    }
  }, 60_000)
})
