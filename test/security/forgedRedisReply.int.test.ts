import net from 'node:net'
import { Redis } from 'ioredis'
import type pg from 'pg'
import { afterAll, beforeAll, describe, expect, it, type TestContext } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { recordingUpstream, type TestUpstream } from '../helpers/fakeUpstreams.ts'
import { TEST_REDIS_URL, startRedisCluster, suiteKeyPrefix } from '../helpers/redis.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { turns } from '../helpers/turns.ts'
import { eventually, sleep } from '../gateway/rateLimit/httpLimits.ts'
import { startGatewayProcess } from '../ops/gatewayProcess.ts'
import { killAll } from '../scripts/processes.ts'

/**
 * A reply nested 10,000 arrays deep (`*1\r\n` … `:1\r\n`, 40 KB): a parser that recurses per level
 * runs out of stack on it. From a compromised Redis, or on-path on a cleartext connection.
 */
const NESTED_REPLY = Buffer.from(`${'*1\r\n'.repeat(10_000)}:1\r\n`)

/**
 * CLUSTER SLOTS replies that are no slot map, each where ioredis's reader indexes into it: no
 * map at all, a nil where a slot range should be, a nil where a range's node should be; and a
 * range past the 16,384 slots, which ioredis fills slot by slot.
 */
const FORGED_SLOT_MAPS = {
  nil: '*-1\r\n',
  'a nil slot range': '*1\r\n*-1\r\n',
  'a nil node': '*1\r\n*3\r\n:0\r\n:16383\r\n*-1\r\n',
  // Not a nil, but ioredis filled its slot table up to it: V8 stopped the process (out of memory).
  'a slot range ending at slot 4,000,000,000': '*1\r\n*3\r\n:0\r\n:4000000000\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n',
}
const CLUSTER_SLOT_COUNT = 16_384
/** Redirects to no node, each answered to every command by a master holding every slot. */
const REDIRECTS_TO_NOWHERE = { 'MOVED 5': '-MOVED 5\r\n', ASK: '-ASK\r\n', 'ASK 5': '-ASK 5\r\n' }

/** The tests run side by side, two gateways at work at once; their timeouts leave room for waiting a turn. */
const gatewayTurns = turns(2)

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
  it.concurrent('nested 10,000 arrays deep: the gateway keeps running, answers per onStoreFailure (closed: 503), and decides in Redis again once the replies are Redis\'s', async ({ onTestFinished }) => {
    onTestFinished(await gatewayTurns.take())
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
  }, 120_000)

  // Each test its own gateway, seed (or relay) and key: they run side by side.
  describe.concurrent('a Redis Cluster node whose replies ioredis cannot read', () => {
    const cluster = suiteService(() => startRedisCluster())

    /** A gateway with `seed` as its one Cluster seed (onStoreFailure closed), and a keyed request's status through it. */
    async function gatewayOn(seed: Awaited<ReturnType<typeof clusterSeedAnswering>>, { onTestFinished }: TestContext) {
      onTestFinished(await gatewayTurns.take())
      const gateway = await startGatewayProcess({
        databaseUrl: database.url,
        petsUrl: upstream.url,
        env: { REDIS_CLUSTER_NODES: `127.0.0.1:${seed.port}` },
        configure: (file) => {
          file.redis.keyPrefix = prefix
          file.onStoreFailure = 'closed'
        },
        notReady: true,
        readyTimeoutMillis: 30_000,
      }).catch(async (error: unknown) => {
        await seed.close()
        throw error
      })
      const { key } = await createKeyRepository(pool).create({ name: 'unreadable-cluster-reply', plan: 'free' })
      return {
        gateway,
        async request() {
          const response = await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` }, signal: AbortSignal.timeout(5_000) })
          await response.arrayBuffer()
          return response.status
        },
        async stop() {
          gateway.proc.kill()
          gateway.cleanup()
          await seed.close()
        },
      }
    }

    // ioredis reads the reply in a callback that threw a TypeError on each of these, re-thrown
    // outside any handler: the gateway process died at the first one, at start or at any later
    // slot-map refresh.
    it.for(Object.entries(FORGED_SLOT_MAPS))('%s: the gateway keeps running, answers per onStoreFailure (closed: 503), and decides in the cluster once the seed answers for real', { timeout: 120_000 }, async ([shape, forged], context) => {
      const seed = await clusterSeedAnswering(cluster.nodes[0]!)
      seed.forgeSlots(Buffer.from(forged))
      const { gateway, request, stop } = await gatewayOn(seed, context)
      try {
        // After a failed refresh the client asks the seed again within a second, then every second.
        await eventually(async () => seed.forgedReplies() >= 3, 10_000)
        const whileForged = [await request(), await request()]
        expect(gateway.proc.hasExited(), `the gateway exited:\n${gateway.proc.output().slice(-3_000)}`).toBe(false)
        expect(whileForged).toEqual([503, 503])
        expect((await gateway.readyz()).body.reasons?.redis).toContain('a CLUSTER SLOTS reply that is no slot map')

        seed.forgeSlots(undefined)
        const recoveredMillis = await eventually(async () => (await gateway.readyz()).status === 200, 15_000)
        expect(await request()).toBe(200)
        expect(gateway.proc.hasExited()).toBe(false)
        recordScenario({
          area: 'Hostile input',
          scenario: `a Redis Cluster seed answering CLUSTER SLOTS with ${shape} where the slot map should be (a broken or hostile node)`,
          answered: `the gateway kept running: keyed requests answered 503 (onStoreFailure closed) meanwhile, /readyz naming the reply; ready again ${Math.round(recoveredMillis)} ms after the seed's replies were the cluster's, then 200`,
          lost: 'nothing: no process exit; each such reply failed its refresh, as a node that cannot answer does',
          test: 'test/security/forgedRedisReply.int.test.ts',
        })
      } finally {
        await stop()
      }
    })

    // ioredis took the missing node for an address and threw a TypeError out of the socket's data
    // handler: the gateway process died at the first such answer to a decision's script.
    it.for(Object.entries(REDIRECTS_TO_NOWHERE))('a master answering %s (a redirect naming no node): the gateway keeps running, answers per onStoreFailure (closed: 503), and decides in the cluster once the slot map is the cluster\'s', { timeout: 120_000 }, async ([shape, forged], context) => {
      const seed = await clusterSeedAnswering(cluster.nodes[0]!)
      seed.claimSlots(Buffer.from(forged))
      const { gateway, request, stop } = await gatewayOn(seed, context)
      try {
        const whileForged = []
        for (let i = 0; i < 3; i++) {
          whileForged.push(await request())
          await sleep(200)
        }
        expect(seed.forgedReplies(), 'the seed answered a command with the redirect').toBeGreaterThan(0)
        expect(gateway.proc.hasExited(), `the gateway exited:\n${gateway.proc.output().slice(-3_000)}`).toBe(false)
        expect(whileForged).toEqual([503, 503, 503])

        // The client reads the slot map again every 5 s, and then finds the cluster's own nodes.
        seed.claimSlots(undefined)
        const recoveredMillis = await eventually(async () => (await request()) === 200, 20_000, 250)
        expect(gateway.proc.hasExited()).toBe(false)
        recordScenario({
          area: 'Hostile input',
          scenario: `a Redis Cluster master answering every command with ${shape}, a redirect naming no node (a broken or hostile node)`,
          answered: `the gateway kept running: keyed requests answered 503 (onStoreFailure closed) meanwhile; 200 again ${Math.round(recoveredMillis)} ms after the slot map was the cluster's`,
          lost: 'nothing: no process exit; each such redirect failed its command, as an error reply does',
          test: 'test/security/forgedRedisReply.int.test.ts',
        })
      } finally {
        await stop()
      }
    })
  })
})

/**
 * A Redis Cluster seed that answers CLUSTER SLOTS itself: with `forgeSlots`'s bytes while they are
 * set; while `claimSlots` has set a reply, with a map giving it every slot, and that reply to every
 * command but CLIENT's and INFO's (a connection's ready check); else with the slot map of the real cluster `node` (which then serves every
 * command, as the map names only the cluster's own nodes). Any other command it answers +OK (the
 * client names its connection before asking).
 */
async function clusterSeedAnswering(node: string) {
  const [host, port] = node.split(':')
  const real = new Redis({ host, port: Number(port), lazyConnect: true })
  let forged: Buffer | undefined
  let claimedWith: Buffer | undefined
  let forgedCount = 0
  const sockets = new Set<net.Socket>()
  const server = net.createServer((socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => undefined)
    let buffered = Buffer.alloc(0)
    let answering = Promise.resolve()
    socket.on('data', (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk])
      for (let command = takeCommand(); command; command = takeCommand()) {
        const words = command.map((word) => word.toUpperCase())
        answering = answering.then(async () => {
          const slots = words[0] === 'CLUSTER' && words[1] === 'SLOTS'
          if (words[0] === 'INFO') return void socket.write(encodeResp('# Persistence\r\nloading:0\r\n'))
          if (claimedWith && !slots && words[0] !== 'CLIENT') {
            forgedCount++
            return void socket.write(claimedWith)
          }
          if (!slots) return void socket.write('+OK\r\n')
          if (forged) {
            forgedCount++
            return void socket.write(forged)
          }
          const self = ['127.0.0.1', (server.address() as net.AddressInfo).port, 'forging-seed']
          socket.write(encodeResp(claimedWith ? [[0, CLUSTER_SLOT_COUNT - 1, self]] : await real.call('CLUSTER', 'SLOTS')))
        })
      }
    })
    /** The next whole command (a RESP array of bulk strings) off the buffer, or undefined. */
    function takeCommand(): string[] | undefined {
      const text = buffered.toString('latin1')
      const header = /^\*(\d+)\r\n/.exec(text)
      if (!header) return undefined
      const words: string[] = []
      let at = header[0].length
      for (let i = 0; i < Number(header[1]); i++) {
        const length = /^\$(\d+)\r\n/.exec(text.slice(at))
        if (!length || text.length < at + length[0].length + Number(length[1]) + 2) return undefined
        at += length[0].length
        words.push(text.slice(at, at + Number(length[1])))
        at += Number(length[1]) + 2
      }
      buffered = buffered.subarray(at)
      return words
    }
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as net.AddressInfo).port,
    forgeSlots(reply: Buffer | undefined) {
      forged = reply
    },
    claimSlots(reply: Buffer | undefined) {
      claimedWith = reply
    },
    forgedReplies: () => forgedCount,
    async close() {
      for (const socket of sockets) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
      real.disconnect()
    },
  }
}

function encodeResp(value: unknown): string {
  if (value === null) return '*-1\r\n'
  if (typeof value === 'number') return `:${value}\r\n`
  if (Array.isArray(value)) return `*${value.length}\r\n${value.map(encodeResp).join('')}`
  const text = String(value)
  return `$${Buffer.byteLength(text)}\r\n${text}\r\n`
}
