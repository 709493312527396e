import { Cluster, Redis } from 'ioredis'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { limitKey } from '../../gateway/src/rateLimit/limitStore.ts'
import { connectRedis, redisConnectionProblem, redisReady } from '../../gateway/src/rateLimit/redisStore.ts'
import { eventually } from '../gateway/rateLimit/httpLimits.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { startRedisCluster, testKeyPrefix, type TestCluster } from '../helpers/redis.ts'
import { startPrivateRedis } from '../helpers/redisServer.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { killAll } from '../scripts/processes.ts'
import { startGatewayProcess, type GatewayProcess } from './gatewayProcess.ts'

// README, Managed Postgres and Redis: a Redis Cluster with requirepass or ACL users takes
// REDIS_PASSWORD (and REDIS_USERNAME) for every node; a wrong one is a warning, onStoreFailure
// and a /readyz reason, as a wrong REDIS_URL password is; the password is shown nowhere.
const PASSWORD = 'Cl5ter-S3cr3t-9q7w'
const ACL_PASSWORD = 'Acl-S3cr3t-4x2z'

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

function limited(prefix: string, onStoreFailure: 'open' | 'closed') {
  return (file: GatewayConfigFile) => {
    file.onStoreFailure = onStoreFailure
    file.redis.keyPrefix = prefix
    file.redis.commandTimeoutMillis = 200
    file.plans.free = { perMinute: 2, perDay: 100 }
  }
}

/** Everything the process printed, its /readyz and its /metrics: where a password must not be. */
async function everythingShown(gateway: GatewayProcess): Promise<string> {
  const metrics = await (await fetch(`${gateway.opsUrl}/metrics`)).text()
  return [gateway.proc.output(), JSON.stringify((await gateway.readyz()).body), metrics].join('\n')
}

describe('Redis Cluster with a password (the real gateway process)', () => {
  const database = suiteDatabase()
  let upstream: TestUpstream
  let cluster: TestCluster
  let admin: Cluster

  beforeAll(async () => {
    upstream = await recordingUpstream()
    cluster = await startRedisCluster({ password: PASSWORD })
    const seeds = cluster.nodes.map((node) => ({ host: '127.0.0.1', port: Number(node.split(':')[1]) }))
    admin = new Cluster(seeds, { redisOptions: { password: PASSWORD } })
    admin.on('error', () => undefined)
    // An ACL user for REDIS_USERNAME, on every node (ACLs are per node).
    for (const seed of seeds) {
      const node = new Redis({ ...seed, password: PASSWORD })
      await node.call('ACL', 'SETUSER', 'gateway', 'on', `>${ACL_PASSWORD}`, '~*', '&*', '+@all')
      node.disconnect()
    }
  }, 60_000)
  afterEach(killAll)
  afterAll(async () => {
    admin?.disconnect()
    await cluster?.close()
    await upstream?.close()
  })

  it.each([
    ['REDIS_PASSWORD', { REDIS_PASSWORD: PASSWORD }],
    ['an ACL user: REDIS_USERNAME and REDIS_PASSWORD', { REDIS_USERNAME: 'gateway', REDIS_PASSWORD: ACL_PASSWORD }],
  ])('with %s it admits and refuses through the cluster, ready, and shows the password nowhere', async (_case, credentials) => {
    const prefix = testKeyPrefix()
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_CLUSTER_NODES: cluster.nodes.join(','), ...credentials },
      configure: limited(prefix, 'closed'),
    })
    const pool = createPool({ connectionString: database.url, applicationName: 'cluster-auth-test' })
    try {
      expect(await gateway.readyz()).toEqual({ status: 200, body: { status: 'ready', dependencies: { postgres: 'up', upstream: 'up', redis: 'up' } } })
      const { record, key } = await createKeyRepository(pool).create({ name: 'cluster-auth', plan: 'free' })
      const statuses: number[] = []
      for (let i = 0; i < 3; i++) {
        statuses.push((await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })).status)
      }
      expect(statuses).toEqual([200, 200, 429])
      // Decided in the cluster, not by a per-process store.
      expect(await admin.pttl(`${prefix}${limitKey(record.id)}`)).toBeGreaterThan(0)
      const shown = await everythingShown(gateway)
      expect(shown).not.toContain(PASSWORD)
      expect(shown).not.toContain(ACL_PASSWORD)
    } finally {
      await pool.end()
      gateway.cleanup()
    }
  }, 60_000)

  it.each([
    ['a wrong REDIS_PASSWORD', { REDIS_PASSWORD: 'wrong-S3cr3t' }, 'WRONGPASS'],
    ['a wrong ACL user', { REDIS_USERNAME: 'nobody', REDIS_PASSWORD: ACL_PASSWORD }, 'WRONGPASS'],
    ['no REDIS_PASSWORD', {}, 'NOAUTH'],
  ])('with %s it warns why at start, follows onStoreFailure closed, and /readyz says why', async (_case, credentials, why) => {
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_CLUSTER_NODES: cluster.nodes.join(','), ...credentials },
      configure: limited(testKeyPrefix(), 'closed'),
      notReady: true,
    })
    const pool = createPool({ connectionString: database.url, applicationName: 'cluster-auth-test' })
    try {
      // Log lines leave in batches: the warning may reach stdout a moment after the process listens.
      const warningLine = () => gateway.proc.output().split('\n').find((line) => line.includes('Redis is not reachable yet'))
      await eventually(async () => warningLine() !== undefined, 5_000)
      expect(warningLine()).toContain(why)
      const readyz = await gateway.readyz()
      expect(readyz).toMatchObject({ status: 503, body: { status: 'not_ready', dependencies: { redis: 'down' } } })
      expect(readyz.body.reasons?.redis).toContain(why)
      const { key } = await createKeyRepository(pool).create({ name: 'cluster-auth-wrong', plan: 'free' })
      const response = await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
      expect(response.status).toBe(503)
      expect(((await response.json()) as { code: string }).code).toBe('service_unavailable')
      await sleep(500)
      const shown = await everythingShown(gateway)
      for (const secret of [PASSWORD, ACL_PASSWORD, 'wrong-S3cr3t']) expect(shown).not.toContain(secret)
    } finally {
      await pool.end()
      gateway.cleanup()
    }
  }, 60_000)
})

// REDIS_PASSWORD with a REDIS_URL that names none: the single server gets it too.
describe('REDIS_PASSWORD with a REDIS_URL without credentials', () => {
  it('logs in to a server with requirepass; without it the reason is NOAUTH', async () => {
    const redis = await startPrivateRedis()
    const admin = redis.admin()
    try {
      await admin.connect()
      await admin.config('SET', 'requirepass', PASSWORD)
      const withPassword = connectRedis({ url: redis.url, password: PASSWORD, commandTimeoutMillis: 200 })
      const without = connectRedis({ url: redis.url, commandTimeoutMillis: 200 })
      try {
        expect(await redisReady(withPassword)).toBe(true)
        expect(await redisReady(without, 1_000)).toBe(false)
        expect(redisConnectionProblem(without)).toContain('NOAUTH')
      } finally {
        withPassword.disconnect()
        without.disconnect()
      }
    } finally {
      admin.disconnect()
      await redis.close()
    }
  }, 30_000)
})
