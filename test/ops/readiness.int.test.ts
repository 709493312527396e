import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { recordingUpstream, refusingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { freePort } from '../helpers/ports.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../helpers/redis.ts'
import { startPrivateRedis } from '../helpers/redisServer.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { startPetsService, type RunningPetsService } from '../helpers/petsService.ts'
import { killAll } from '../scripts/processes.ts'
import { OPS_TEST_TOKEN, cuttableRelay, startGatewayProcess, type GatewayProcess } from './gatewayProcess.ts'
import { relayTo } from '../helpers/tcpRelay.ts'

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/** Polls /readyz until it answers `status`; returns that answer. */
async function readyzBecomes(gateway: GatewayProcess, status: number, timeoutMillis = 5_000) {
  const deadline = Date.now() + timeoutMillis
  let last: Awaited<ReturnType<GatewayProcess['readyz']>> | undefined
  while (Date.now() < deadline) {
    last = await gateway.readyz()
    if (last.status === status) return last
    await sleep(100)
  }
  throw new Error(`/readyz did not answer ${status} within ${timeoutMillis} ms; last ${JSON.stringify(last)}`)
}

/** The pets-service's http_requests_total samples, as its /metrics would serve them. */
async function requestCounts(pets: RunningPetsService): Promise<string[]> {
  return (await pets.registry.metrics()).split('\n').filter((line) => line.startsWith('http_requests_total{'))
}

function storeConfig(prefix: string, onStoreFailure: 'open' | 'closed') {
  return (file: GatewayConfigFile) => {
    file.onStoreFailure = onStoreFailure
    file.redis.keyPrefix = prefix
    file.redis.commandTimeoutMillis = 200
  }
}

describe('gateway readiness (/readyz of the real process)', () => {
  const database = suiteDatabase()
  let upstream: TestUpstream
  const prefix = suiteKeyPrefix()

  beforeAll(async () => {
    upstream = await recordingUpstream()
  })
  afterEach(killAll)
  afterAll(async () => {
    await upstream?.close()
  })

  it('is not ready, naming postgres, while Postgres is unreachable, and ready again when it returns', async () => {
    const { relay, url: postgres } = await relayTo(database.url)
    const gateway = await startGatewayProcess({ databaseUrl: postgres, petsUrl: upstream.url })
    try {
      expect(await gateway.readyz()).toEqual({ status: 200, body: { status: 'ready', dependencies: { postgres: 'up', upstream: 'up' } } })
      await relay.cut()
      const down = await readyzBecomes(gateway, 503)
      expect(down.body).toMatchObject({ status: 'not_ready', dependencies: { postgres: 'down', upstream: 'up' } })
      expect(Object.keys(down.body.dependencies!)).toEqual(['postgres', 'upstream'])
      // Why, in words that name no address (the driver's message does).
      expect(down.body.reasons).toEqual({ postgres: expect.stringMatching(/^no answer from Postgres \((E[A-Z]+|timed out|connection lost|unreachable)\)$/) })
      await relay.restore()
      await readyzBecomes(gateway, 200)
    } finally {
      await relay.close()
      gateway.cleanup()
    }
  })

  it('is ready against a pets-service that accepts its INTERNAL_TOKEN, and the probe is no client error there', async () => {
    const pets = await startPetsService(database.url, { internalToken: OPS_TEST_TOKEN })
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: pets.url, readyTimeoutMillis: 30_000 })
    try {
      for (let probe = 0; probe < 3; probe++) {
        expect(await gateway.readyz()).toEqual({ status: 200, body: { status: 'ready', dependencies: { postgres: 'up', upstream: 'up' } } })
      }
      const counts = await requestCounts(pets)
      // Every probe (the three above and those of waiting for ready) got 204 from GET /auth-check.
      expect(counts.filter((line) => !line.includes('status_class="2xx"'))).toEqual([])
      const probes = counts.find((line) => line.startsWith('http_requests_total{method="GET",route="/auth-check",status_class="2xx"}'))
      expect(Number(probes?.split(' ').at(-1))).toBeGreaterThanOrEqual(3)
    } finally {
      gateway.cleanup()
      await pets.close()
    }
  })

  it('opens at most DATABASE_POOL_SIZE Postgres connections for its pool, and its ops scrape says how many that is', async () => {
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url, env: { DATABASE_POOL_SIZE: '3' } })
    try {
      const scrape = await (await fetch(`${gateway.opsUrl}/metrics`)).text()
      expect(scrape).toMatch(/^pg_pool_connections\{state="max"\} 3$/m)
      expect(Number(/^pg_pool_connections\{state="total"\} (\d+)$/m.exec(scrape)?.[1])).toBeLessThanOrEqual(3)
    } finally {
      gateway.cleanup()
    }
  })

  it('is not ready, saying why, when the pets-service refuses its INTERNAL_TOKEN', async () => {
    const pets = await startPetsService(database.url, { internalToken: 'another-internal-token-0123456789' })
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: pets.url, notReady: true, readyTimeoutMillis: 30_000 })
    try {
      const answer = await readyzBecomes(gateway, 503)
      expect(answer.body).toEqual({
        status: 'not_ready',
        dependencies: { postgres: 'up', upstream: 'down' },
        reasons: { upstream: expect.stringContaining('the upstream refuses the internal credential') },
      })
      expect(answer.body.reasons?.upstream).toContain('INTERNAL_TOKEN differs')
      expect((await gateway.readyz()).status).toBe(503)
    } finally {
      gateway.cleanup()
      await pets.close()
    }
  })

  it('is not ready, saying why, while nothing answers at the upstream address', async () => {
    const dead = await refusingUpstream()
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: dead.url, notReady: true })
    try {
      const answer = await readyzBecomes(gateway, 503)
      expect(answer.body).toEqual({
        status: 'not_ready',
        dependencies: { postgres: 'up', upstream: 'down' },
        reasons: { upstream: `no answer from ${dead.url} (ECONNREFUSED)` },
      })
    } finally {
      gateway.cleanup()
    }
  })

  it('stays ready with Redis down when onStoreFailure is open, and keeps answering requests', async () => {
    const deadRedis = `redis://127.0.0.1:${await freePort()}`
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_URL: deadRedis },
      configure: storeConfig(prefix, 'open'),
    })
    const pool = createPool({ connectionString: database.url, applicationName: 'ops-test' })
    try {
      expect(await gateway.readyz()).toEqual({ status: 200, body: { status: 'ready', dependencies: { postgres: 'up', upstream: 'up' } } })
      const { key } = await createKeyRepository(pool).create({ name: 'open', plan: 'free' })
      const response = await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
      expect(response.status).toBe(200)
      expect(response.headers.get('x-ratelimit-limit')).not.toBeNull()
    } finally {
      await pool.end()
      gateway.cleanup()
    }
  })

  it('is not ready, naming redis, while Redis is unreachable when onStoreFailure is closed', async () => {
    const redis = new URL(TEST_REDIS_URL)
    const relay = await cuttableRelay({ host: redis.hostname, port: Number(redis.port || 6379) })
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_URL: `redis://127.0.0.1:${relay.port}` },
      configure: storeConfig(prefix, 'closed'),
    })
    try {
      expect(await gateway.readyz()).toEqual({
        status: 200,
        body: { status: 'ready', dependencies: { postgres: 'up', upstream: 'up', redis: 'up' } },
      })
      await relay.cut()
      const down = await readyzBecomes(gateway, 503)
      expect(down.body).toMatchObject({ status: 'not_ready', dependencies: { postgres: 'up', upstream: 'up', redis: 'down' } })
      // The reason is the connection's, not the ops server's "no answer within 1000 ms" after a wait
      // (ioredis's own words when the cut lands while a probe is under way).
      expect(down.body.reasons?.redis).toMatch(/^Redis is not connected \(|Stream isn't writeable|Connection is closed|max retries/)
      expect(Object.keys(down.body.dependencies!)).toEqual(['postgres', 'upstream', 'redis'])
      await relay.restore()
      await readyzBecomes(gateway, 200)
    } finally {
      await relay.close()
      gateway.cleanup()
    }
  })

  // Regression: readiness asked only whether the connection was up, so a frozen or full Redis
  // kept the gateway "ready" while it answered every request 503.
  it('is not ready while Redis is connected but frozen or out of memory when onStoreFailure is closed, and ready again after', async () => {
    const redis = await startPrivateRedis()
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_URL: redis.url },
      configure: storeConfig(prefix, 'closed'),
    })
    const admin = redis.admin()
    try {
      await admin.connect()
      expect((await gateway.readyz()).status).toBe(200)

      redis.freeze()
      const frozen = await readyzBecomes(gateway, 503)
      expect(frozen.body).toMatchObject({ dependencies: { redis: 'down' }, reasons: { redis: expect.stringMatching(/did not answer within \d+ ms/) } })
      redis.thaw()
      await readyzBecomes(gateway, 200)

      await admin.config('SET', 'maxmemory', '1')
      const full = await readyzBecomes(gateway, 503)
      expect(full.body).toMatchObject({ dependencies: { redis: 'down' }, reasons: { redis: expect.stringContaining('OOM') } })
      await admin.config('SET', 'maxmemory', '0')
      await readyzBecomes(gateway, 200)
    } finally {
      redis.thaw()
      admin.disconnect()
      gateway.cleanup()
      await redis.close()
    }
  })
})
