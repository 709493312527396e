import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { SLOTS_REFRESH_MILLIS } from '../../../gateway/src/rateLimit/redisStore.ts'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { captureLog } from '../../helpers/logCapture.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { startRedisCluster, testKeyPrefix } from '../../helpers/redis.ts'
import { suiteService } from '../../helpers/suiteService.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'

/** A node that accepts writes again after a restart: Redis holds a restarted master back 2 s, plus the client's reconnect. */
const BACK_WITHIN_MILLIS = 15_000
const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

async function send(node: string, ...args: (string | number)[]): Promise<unknown> {
  const [host, port] = node.split(':')
  const client = new Redis({ host, port: Number(port), lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null })
  client.on('error', () => undefined)
  try {
    await client.connect()
    return await client.call(String(args[0]), ...args.slice(1))
  } finally {
    client.disconnect()
  }
}

const nodeId = async (node: string) => String(await send(node, 'CLUSTER', 'MYID'))

/** The master serving `slot`, as host:port, in `node`'s view. */
async function masterOf(node: string, slot: number): Promise<string> {
  const ranges = (await send(node, 'CLUSTER', 'SLOTS')) as [number, number, [string, number]][]
  const range = ranges.find(([from, to]) => slot >= from && slot <= to)
  if (!range) throw new Error(`no node serves slot ${slot}`)
  return `${range[2][0]}:${range[2][1]}`
}

/** Calls `node` took after an ASK redirect (each is preceded by ASKING). */
async function askingCalls(node: string): Promise<number> {
  const asking = /cmdstat_asking:calls=(\d+)/.exec(String(await send(node, 'INFO', 'commandstats')))
  return Number(asking?.[1] ?? 0)
}

async function waitFor(what: string, condition: () => Promise<boolean>): Promise<void> {
  const deadline = performance.now() + 10_000
  while (!(await condition().catch(() => false))) {
    if (performance.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await sleep(50)
  }
}

/** The gateways' store trouble as logged: level, message and node. */
const storeLines = (log: ReturnType<typeof captureLog>) =>
  log.entries().filter((entry) => String(entry.msg).startsWith('rate-limit store')).map((entry) => [entry.level, entry.msg, entry.node])

function gatewaysOn(nodes: () => string[], count: number) {
  const prefix = testKeyPrefix()
  const database = suiteDatabase()
  const logs = Array.from({ length: count }, () => captureLog())
  const gateways: RunningGateway[] = []
  let pets: RunningPetsService
  beforeAll(async () => {
    pets = await startPetsService(database.url)
    for (const log of logs) {
      gateways.push(
        await startGateway({
          databaseUrl: database.url,
          petsUrl: pets.url,
          logStream: log.stream,
          env: { REDIS_CLUSTER_NODES: nodes().join(',') },
          configure: (file) => {
            file.redis.keyPrefix = prefix
            // Every request the store could not decide is a 503 a test can see; a budget this
            // loose keeps a loaded machine's late reply from looking like one.
            file.onStoreFailure = 'closed'
            file.redis.commandTimeoutMillis = 500
          },
        }),
      )
    }
  })
  afterAll(async () => {
    for (const gateway of gateways) await gateway.close()
    await pets?.close()
  })
  return { prefix, gateways, logs }
}

describe('Redis Cluster: the slot of a key in use is resharded to another master while two gateways serve it', () => {
  const cluster = suiteService(() => startRedisCluster())
  const { prefix, gateways, logs } = gatewaysOn(() => cluster.nodes, 2)

  it('decides every request on Redis through ASK and MOVED, and holds the limit exactly', async () => {
    // Far more than the traffic of the reshard's steps admits, so the slot moves before the limit is met.
    const LIMIT = 250
    const { id, key } = await gateways[0]!.createKey({ plan: 'enterprise', perMinute: LIMIT, perDay: 1_000_000 })
    const seed = cluster.nodes[0]!
    const slot = Number(await send(seed, 'CLUSTER', 'KEYSLOT', `${prefix}${limitKey(id)}`))
    const source = await masterOf(seed, slot)
    const target = cluster.nodes.find((node) => node !== source)!
    const [sourceId, targetId] = [await nodeId(source), await nodeId(target)]

    const answers: { status: number; code?: string; remaining: number }[] = []
    let stopping = false
    const workers = gateways.flatMap((gateway) =>
      Array.from({ length: 2 }, async () => {
        while (!stopping) {
          const response = await gateway.request('/v1/pets?limit=1', { key })
          const body = (await response.json()) as { code?: string }
          answers.push({ status: response.status, code: body.code, remaining: Number(response.headers.get('x-ratelimit-remaining')) })
          await sleep(25)
        }
      }),
    )
    const admitted = () => answers.filter((answer) => answer.status === 200)
    const admittedAt: Record<string, number> = {}
    try {
      await waitFor('requests are admitted', async () => admitted().length >= 15)
      // What redis-cli --cluster reshard does for one slot, with traffic in each step: while the
      // slot migrates, calls for a key already moved are answered ASK; after, MOVED.
      admittedAt.migrating = admitted().length
      await send(target, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', sourceId)
      await send(source, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', targetId)
      await sleep(400)
      admittedAt.keysMoved = admitted().length
      const keys = (await send(source, 'CLUSTER', 'GETKEYSINSLOT', slot, 100)) as string[]
      const [host, port] = target.split(':')
      await send(source, 'MIGRATE', host!, port!, '', 0, 5_000, 'KEYS', ...keys)
      await waitFor('a call for the moved key is redirected with ASK', async () => (await askingCalls(target)) > 0)
      admittedAt.slotMoved = admitted().length
      for (const node of [target, source, ...cluster.nodes.filter((node) => node !== source && node !== target)]) {
        await send(node, 'CLUSTER', 'SETSLOT', slot, 'NODE', targetId)
      }
      await waitFor('the limit is met', async () => answers.some((answer) => answer.code === 'rate_limited'))
      await sleep(200)
    } finally {
      stopping = true
      await Promise.all(workers)
    }

    expect(await masterOf(seed, slot)).toBe(target)
    expect(await askingCalls(target), 'calls redirected with ASK while the slot migrated').toBeGreaterThan(0)
    expect(admittedAt.slotMoved, 'requests admitted before the slot was handed over').toBeLessThan(LIMIT)
    for (const answer of answers) expect([200, 429], JSON.stringify(answer)).toContain(answer.status)
    // Each admission was counted once, on one master: exactly the limit, each with its own remaining.
    expect(admitted()).toHaveLength(LIMIT)
    expect(new Set(admitted().map((answer) => answer.remaining)).size).toBe(LIMIT)
    for (const log of logs) expect(storeLines(log)).toEqual([])
  }, 60_000)
})

describe('Redis Cluster: every node named in REDIS_CLUSTER_NODES has left the cluster', () => {
  const cluster = suiteService(() => startRedisCluster({ spareNodes: 3 }))
  const { gateways } = gatewaysOn(() => cluster.nodes, 1)

  // Regression: after losing every node connection at once, the client started over from the
  // seeds alone, and with none of them left every request got 503 until the gateway restarted.
  it('the gateway finds the cluster again after its nodes all restart', async () => {
    const gateway = gateways[0]!
    const { key } = await gateway.createKey({ plan: 'enterprise', perMinute: 100_000, perDay: 1_000_000 })
    const status = async () => (await gateway.request('/v1/pets?limit=1', { key })).status
    const statusBecomes200 = async () => {
      const deadline = performance.now() + BACK_WITHIN_MILLIS
      while (performance.now() < deadline) {
        if ((await status()) === 200) return true
        await sleep(50)
      }
      return false
    }
    expect(await status()).toBe(200)

    // The nodes are replaced the usual way: each new node replicates an old master and takes over
    // from it, then the old ones are forgotten and stopped.
    for (const spare of cluster.spares) {
      const [host, port] = spare.split(':')
      await send(cluster.nodes[0]!, 'CLUSTER', 'MEET', host!, port!)
    }
    for (const [index, spare] of cluster.spares.entries()) {
      const master = await nodeId(cluster.nodes[index]!)
      await waitFor(`${spare} knows ${cluster.nodes[index]}`, async () => String(await send(spare, 'CLUSTER', 'NODES')).includes(master))
      await send(spare, 'CLUSTER', 'REPLICATE', master)
      await waitFor(`${spare} replicates`, async () => String(await send(spare, 'INFO', 'replication')).includes('master_link_status:up'))
      await send(spare, 'CLUSTER', 'FAILOVER')
      await waitFor(`${spare} is a master`, async () => String(await send(spare, 'INFO', 'replication')).includes('role:master'))
    }
    // No request in between: the gateway learns the new masters from its periodic read of the slot map.
    await sleep(SLOTS_REFRESH_MILLIS + 1_000)
    const oldIds = await Promise.all(cluster.nodes.map(nodeId))
    for (const child of cluster.processes.slice(0, cluster.nodes.length)) child.kill('SIGKILL')
    for (const spare of cluster.spares) for (const id of oldIds) await send(spare, 'CLUSTER', 'FORGET', id)
    expect(await statusBecomes200(), 'decided on Redis once the seeds are gone').toBe(true)

    await Promise.all(cluster.spares.map((spare) => cluster.restart(spare)))
    expect(await statusBecomes200(), 'decided on Redis again after every node restarted').toBe(true)
  }, 90_000)
})
