import calculateSlot from 'cluster-key-slot'
import { Cluster, Redis } from 'ioredis'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { limitKey } from '../../gateway/src/rateLimit/limitStore.ts'
import { SLOTS_REFRESH_MILLIS, connectRedis, redisConnectionProblem, redisReady } from '../../gateway/src/rateLimit/redisStore.ts'
import { eventually, sleep } from '../gateway/rateLimit/httpLimits.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { startRedisCluster, testKeyPrefix, type TestCluster } from '../helpers/redis.ts'
import { startPrivateRedis } from '../helpers/redisServer.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { exitWithin, killAll, startNode } from '../scripts/processes.ts'
import { gatewayProcessEnv, startGatewayProcess, type GatewayProcess } from './gatewayProcess.ts'

// README, Managed Postgres and Redis: a Redis Cluster with requirepass or ACL users takes
// REDIS_PASSWORD (and REDIS_USERNAME) for every node; a wrong one stops the gateway at start, as
// a wrong REDIS_URL password does; the password is shown nowhere.
const PASSWORD = 'Cl5ter-S3cr3t-9q7w'
const ACL_PASSWORD = 'Acl-S3cr3t-4x2z'

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

  /** What a gateway process started against the cluster with `credentials` printed; it must exit 1 at start. */
  async function refusedStart(credentials: NodeJS.ProcessEnv): Promise<string> {
    const { env } = await gatewayProcessEnv({ databaseUrl: database.url, petsUrl: upstream.url, extra: { REDIS_CLUSTER_NODES: cluster.nodes.join(','), ...credentials } })
    const gateway = startNode('gateway/src/main.ts', env)
    expect(await exitWithin(gateway, 30_000)).toEqual({ code: 1, signal: null })
    return gateway.output()
  }

  it.each([
    ['a wrong REDIS_PASSWORD', { REDIS_PASSWORD: 'wrong-S3cr3t' }, 'WRONGPASS'],
    ['a wrong ACL user', { REDIS_USERNAME: 'nobody', REDIS_PASSWORD: ACL_PASSWORD }, 'WRONGPASS'],
    ['no REDIS_PASSWORD', {}, 'NOAUTH'],
  ])('with %s it exits 1 at start, naming REDIS_CLUSTER_NODES and why, and shows no password', async (_case, credentials, why) => {
    const output = await refusedStart(credentials)
    expect(output).toContain("gateway cannot start: cannot use Redis at REDIS_CLUSTER_NODES: it refuses the gateway's credentials (Failed to refresh slots cache.")
    expect(output).toContain(why)
    for (const secret of [PASSWORD, ACL_PASSWORD, 'wrong-S3cr3t']) expect(output).not.toContain(secret)
  }, 60_000)

  // ACLs and requirepass are per node: a node set up apart from the others (the ACL user
  // forgotten on it, its password rotated first) refuses the gateway while the rest accept it.
  // Started anyway, the keys in that node's slots got 503 (closed) or per-process limits (open),
  // logged only as "Redis did not answer within …", while /readyz said ready.
  describe('one node refusing the password the others accept', () => {
    let refusing: Redis
    let address: string
    beforeAll(async () => {
      address = cluster.nodes[2]!
      refusing = new Redis({ host: '127.0.0.1', port: Number(address.split(':')[1]), password: PASSWORD })
      // Stays logged in: Redis asks new connections only.
      await refusing.config('SET', 'requirepass', 'Node-Apart-S3cr3t')
    })
    afterAll(async () => {
      await refusing?.config('SET', 'requirepass', PASSWORD)
      refusing?.disconnect()
    })

    it('exits 1 at start, naming the node and its refusal, and shows no password', async () => {
      const output = await refusedStart({ REDIS_PASSWORD: PASSWORD })
      expect(output).toContain(`gateway cannot start: cannot use Redis at REDIS_CLUSTER_NODES: it refuses the gateway's credentials (${address}: WRONGPASS`)
      for (const secret of [PASSWORD, 'Node-Apart-S3cr3t']) expect(output).not.toContain(secret)
    }, 60_000)
  })

  // The same user, but one node's ACL left narrower than the others' (ACLs are per node): the
  // start-up check reaches every master, not only the one that holds its first probe key.
  describe('one node whose ACL user lacks a command the others grant', () => {
    let narrow: Redis
    let address: string
    beforeAll(async () => {
      address = cluster.nodes[2]!
      narrow = new Redis({ host: '127.0.0.1', port: Number(address.split(':')[1]), password: PASSWORD })
      await narrow.call('ACL', 'SETUSER', 'gateway', '-evalsha')
    })
    afterAll(async () => {
      await narrow?.call('ACL', 'SETUSER', 'gateway', '+@all')
      narrow?.disconnect()
    })

    it('exits 1 at start, naming the node, Redis\'s refusal and the README\'s ACL', async () => {
      const output = await refusedStart({ REDIS_USERNAME: 'gateway', REDIS_PASSWORD: ACL_PASSWORD })
      expect(output).toContain(`gateway cannot start: cannot use Redis at REDIS_CLUSTER_NODES: it refuses the gateway a command or key it needs (${address}: NOPERM this user has no permissions to run the 'evalsha' command)`)
      expect(output).toContain('+cluster|slots')
      expect(output).not.toContain(ACL_PASSWORD)
    }, 60_000)
  })

  it('a user without +cluster|slots (on every node) exits 1 at start, naming Redis\'s refusal', async () => {
    const nodes = cluster.nodes.map((node) => new Redis({ host: '127.0.0.1', port: Number(node.split(':')[1]), password: PASSWORD }))
    try {
      for (const node of nodes) await node.call('ACL', 'SETUSER', 'gateway', '-cluster|slots')
      const output = await refusedStart({ REDIS_USERNAME: 'gateway', REDIS_PASSWORD: ACL_PASSWORD })
      expect(output).toContain("gateway cannot start: cannot use Redis at REDIS_CLUSTER_NODES: it refuses the gateway a command or key it needs (Redis is not connected")
      expect(output).toContain("NOPERM this user has no permissions to run the 'cluster|slots' command")
    } finally {
      for (const node of nodes) {
        await node.call('ACL', 'SETUSER', 'gateway', '+@all')
        node.disconnect()
      }
    }
  }, 60_000)

  // A reshard under way: the slot of the start-up check's probe key is MIGRATING, its keys gone
  // from the old master, which answers ASK; ioredis follows it with ASKING on the new one.
  it.each([
    ['the README\'s Cluster ACL', 'up', ['+asking']],
    // Its calls for the moving slot's keys (the probe's among them) fail until the move is done.
    ['a user without +asking (the README\'s ACL before it listed it)', 'down', []],
  ])('started while a reshard moves the probe key\'s slot, with %s: the gateway starts, not ended by a refused ASKING, and /readyz (closed) says Redis is %s', async (_case, redis, extra) => {
    const nodes = cluster.nodes.map((node) => new Redis({ host: '127.0.0.1', port: Number(node.split(':')[1]), password: PASSWORD }))
    const slot = calculateSlot(limitKey('readiness-probe'))
    const ids = await Promise.all(nodes.map(async (node) => String(await node.call('CLUSTER', 'MYID'))))
    const owners = (await nodes[0]!.call('CLUSTER', 'SLOTS')) as [number, number, [string, number, string]][]
    const owner = ids.indexOf(owners.find(([first, last]) => first <= slot && slot <= last)![2][2])
    const importer = (owner + 1) % nodes.length
    try {
      for (const node of nodes) {
        await node.call('ACL', 'SETUSER', 'resharded', 'reset', 'on', `>${ACL_PASSWORD}`, 'resetkeys', '~rl:*', '~anon:*', 'resetchannels', '-@all',
          '+evalsha', '+eval', '+time', '+get', '+set', '+pttl', '+incrby', '+expire', '+info', '+cluster|slots', ...extra)
      }
      // Moved already (or never written): the old master answers ASK for it.
      await nodes[owner]!.del(limitKey('readiness-probe'))
      await nodes[importer]!.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[owner]!)
      await nodes[owner]!.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[importer]!)
      const gateway = await startGatewayProcess({
        databaseUrl: database.url,
        petsUrl: upstream.url,
        env: { REDIS_CLUSTER_NODES: cluster.nodes.join(','), REDIS_USERNAME: 'resharded', REDIS_PASSWORD: ACL_PASSWORD },
        configure: (file) => void (file.onStoreFailure = 'closed'),
        notReady: true,
      })
      try {
        expect((await gateway.readyz()).body.dependencies?.redis).toBe(redis)
        await sleep(500)
        expect(gateway.proc.hasExited()).toBe(false)
        expect(gateway.proc.output()).not.toContain('cannot start')
      } finally {
        gateway.cleanup()
      }
    } finally {
      // What the gateway wrote on the new master (through ASKING) is dropped with the move.
      await nodes[importer]!.call('ASKING')
      await nodes[importer]!.del(limitKey('readiness-probe'))
      for (const node of [nodes[owner]!, nodes[importer]!]) await node.call('CLUSTER', 'SETSLOT', slot, 'STABLE')
      for (const node of nodes) node.disconnect()
    }
  }, 60_000)

  it('one node starting to refuse while the gateway runs: one error line naming it, no exit, and a line once it accepts again', async () => {
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { REDIS_CLUSTER_NODES: cluster.nodes.join(','), REDIS_PASSWORD: PASSWORD, LOG_LEVEL: 'info' },
      configure: limited(testKeyPrefix(), 'open'),
    })
    const address = cluster.nodes[1]!
    const node = new Redis({ host: '127.0.0.1', port: Number(address.split(':')[1]), password: PASSWORD })
    try {
      await node.config('SET', 'requirepass', 'Node-Rotated-S3cr3t')
      await node.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
      const refusals = () => gateway.proc.output().split('\n').filter((line) => line.includes("Redis refuses the gateway's credentials"))
      await eventually(async () => refusals().length > 0, 10_000)
      expect(refusals()[0]).toContain(`${address}: WRONGPASS`)
      // The node is dropped and tried again at each slot-map refresh (every 5 s): still one line.
      await sleep(SLOTS_REFRESH_MILLIS + 1_000)
      expect(refusals()).toHaveLength(1)
      expect(gateway.proc.hasExited()).toBe(false)
      await node.config('SET', 'requirepass', PASSWORD)
      await eventually(async () => gateway.proc.output().includes("Redis accepts the gateway's credentials again"), 2 * SLOTS_REFRESH_MILLIS)
      expect(gateway.proc.output()).not.toContain('Node-Rotated-S3cr3t')
    } finally {
      await node.config('SET', 'requirepass', PASSWORD)
      node.disconnect()
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
