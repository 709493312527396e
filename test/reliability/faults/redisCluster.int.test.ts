import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { limitKey } from '../../../gateway/src/rateLimit/limitStore.ts'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { startRedisCluster, testKeyPrefix, type TestCluster } from '../../helpers/redis.ts'
import { recordScenario } from '../../helpers/scenarioLog.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'

/**
 * What "answered within the 50 ms Redis budget" may cost end to end, through an in-process gateway
 * and the pets-service, on a loaded 2-core machine (stalls of ~0.9 s were measured); a request
 * waiting on the dead master would take the client's 2 s backstop or more.
 */
const ANSWER_WITHIN_MILLIS = 1_500
/** The closed gateway's key: its minute limit, and the requests kept in flight on it at every moment. */
/** The 1 s skip after a failure, a slot-map refresh and a loaded machine's stalls. */
const RECOVERY_WITHIN_MILLIS = 5_000
const LIMIT = 120
const CONCURRENCY = 4
const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

interface Answer {
  startedAt: number
  millis: number
  status: number
  code?: string
  remaining: number
  /** Open gateway only: the decision came from the per-process fallback, not from Redis. */
  degraded?: boolean
}

function admin(node: string): Redis {
  const [host, port] = node.split(':')
  const client = new Redis({ host, port: Number(port), lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null })
  client.on('error', () => undefined)
  return client
}

async function ask<T>(node: string, command: (client: Redis) => Promise<T>): Promise<T> {
  const client = admin(node)
  try {
    await client.connect()
    return await command(client)
  } finally {
    client.disconnect()
  }
}

/** The master serving `slot` and its replica, as host:port, from `node`'s CLUSTER NODES. */
async function shardOf(node: string, slot: number): Promise<{ master: string; replica: string | undefined }> {
  const lines = String(await ask(node, (client) => client.cluster('NODES'))).trim().split('\n').map((line) => line.split(' '))
  // <id> <host:port@bus> <flags> <master id> <ping> <pong> <epoch> <link> <slot ranges…>
  const address = (fields: string[]) => fields[1]!.split('@')[0]!
  const owner = lines.find(
    (fields) =>
      fields[2]!.includes('master') &&
      !fields[2]!.includes('fail') &&
      fields.slice(8).some((range) => {
        const [from, to = from] = range.split('-').map(Number)
        return from !== undefined && to !== undefined && slot >= from && slot <= to
      }),
  )
  if (!owner) throw new Error(`no node serves slot ${slot}`)
  const replica = lines.find((fields) => fields[2]!.includes('slave') && fields[3] === owner[0])
  return { master: address(owner), replica: replica ? address(replica) : undefined }
}

describe('Redis Cluster: the master holding a key is killed while requests flow', () => {
  const prefix = testKeyPrefix()
  let cluster: TestCluster
  const database = suiteDatabase()
  let pets: RunningPetsService
  let closed: RunningGateway
  let open: RunningGateway

  beforeAll(async () => {
    cluster = await startRedisCluster({ replicasPerMaster: 1 })
    pets = await startPetsService(database.url)
    const gatewayFor = (onStoreFailure: 'open' | 'closed') =>
      startGateway({
        databaseUrl: database.url,
        petsUrl: pets.url,
        env: { REDIS_CLUSTER_NODES: cluster.nodes.join(',') },
        configure: (file) => {
          file.redis.keyPrefix = prefix
          file.onStoreFailure = onStoreFailure
        },
      })
    closed = await gatewayFor('closed')
    open = await gatewayFor('open')
  })
  afterAll(async () => {
    await open?.close()
    await closed?.close()
    await pets?.close()
    await cluster?.close()
  })

  it('answers every request within the budget, recovers on the promoted replica, and over-admits at most the requests in flight', async () => {
    const seed = cluster.nodes[0]!
    const slotOf = async (keyId: string) => Number(await ask(seed, (client) => client.cluster('KEYSLOT', `${prefix}${limitKey(keyId)}`)))
    // Both keys' rate-limit state lives on the same master: the one this test kills.
    const closedKey = await closed.createKey({ plan: 'enterprise', perMinute: LIMIT, perDay: 1_000_000 })
    const slot = await slotOf(closedKey.id)
    const { master, replica } = await shardOf(seed, slot)
    expect(replica, 'the master has a replica').toBeDefined()
    let openKey = await open.createKey({ plan: 'enterprise', perMinute: 100_000, perDay: 1_000_000 })
    for (let attempt = 0; (await shardOf(seed, await slotOf(openKey.id))).master !== master; attempt++) {
      if (attempt > 50) throw new Error(`no key landed on ${master}`)
      openKey = await open.createKey({ plan: 'enterprise', perMinute: 100_000, perDay: 1_000_000 })
    }
    const survivor = cluster.nodes.find((node) => node !== master && node !== replica)!

    const fallbackDecisions = async () => {
      const metric = await open.registry.getSingleMetric('gateway_rate_limit_requests_total')!.get()
      return metric.values.filter((value) => value.labels.source === 'fallback').reduce((sum, value) => sum + value.value, 0)
    }
    const t0 = performance.now()
    async function send(gateway: RunningGateway, key: string): Promise<Answer> {
      const startedAt = performance.now() - t0
      const response = await gateway.request('/v1/pets?limit=1', { key })
      const millis = performance.now() - t0 - startedAt
      const body = (await response.json()) as { code?: string }
      return { startedAt, millis, status: response.status, code: body.code, remaining: Number(response.headers.get('x-ratelimit-remaining')) }
    }

    const closedAnswers: Answer[] = []
    const openAnswers: Answer[] = []
    let stopping = false
    const closedWorkers = Array.from({ length: CONCURRENCY }, async () => {
      while (!stopping) {
        closedAnswers.push(await send(closed, closedKey.key))
        // Paced so that a burst of instant 503s does not crowd out the rest of the test.
        await sleep(15)
      }
    })
    // One sequential client on the open gateway: the fallback counter's step tells each decision's source.
    const openWorker = (async () => {
      let fallback = await fallbackDecisions()
      while (!stopping) {
        const answer = await send(open, openKey.key)
        const now = await fallbackDecisions()
        openAnswers.push({ ...answer, degraded: now > fallback })
        fallback = now
        await sleep(15)
      }
    })()
    const traffic = Promise.all([...closedWorkers, openWorker])

    let killedAt = 0
    let promotedAt = 0
    try {
      // Traffic on Redis first, then the master dies with requests in flight.
      const admitted = () => closedAnswers.filter((answer) => answer.status === 200).length
      const warm = performance.now() + 15_000
      while (admitted() < 40) {
        if (performance.now() > warm) throw new Error(`only ${admitted()} admitted before the kill`)
        await sleep(20)
      }
      // Redis replicates asynchronously: a replica starved of CPU (a loaded CI machine) can fall
      // behind by many scripts, and a failover then loses all of them, which is Redis's bound, not
      // the gateway's. The kill waits until the replica has applied the stream up to a moment
      // just before it, so what this test measures is what the gateway can lose: the requests in
      // flight.
      const offset = async (node: string, field: 'master_repl_offset' | 'slave_repl_offset') => {
        const info = await ask(node, (client) => client.info('replication'))
        const found = new RegExp(`(?:^|\\n)${field}:(\\d+)`).exec(info)
        if (!found) throw new Error(`${node} reports no ${field}:\n${info}`)
        return Number(found[1])
      }
      const index = cluster.nodes.indexOf(master)
      const masterOffset = await offset(master, 'master_repl_offset')
      const caughtUp = performance.now() + 10_000
      while ((await offset(replica!, 'slave_repl_offset')) < masterOffset) {
        if (performance.now() > caughtUp) throw new Error(`the replica did not reach the master's replication offset ${masterOffset} within 10 s`)
        await sleep(5)
      }
      killedAt = performance.now() - t0
      cluster.processes[index]!.kill('SIGKILL')

      // The replica takes over after cluster-node-timeout (2 s) and an election. Promoted once every
      // live node agrees: a gateway refreshes its slot map from any of them, and one that has not
      // heard of the election yet still names the dead master.
      const live = cluster.nodes.filter((node) => node !== master)
      const agrees = (node: string) =>
        ask(node, async (client) => (await client.cluster('INFO')).includes('cluster_state:ok')).then(
          async (ok) => ok && (await shardOf(node, slot)).master === replica,
        )
      const deadline = performance.now() + 20_000
      while (performance.now() < deadline) {
        const promoted = await ask(replica!, async (client) => ((await client.role()) as unknown[])[0] === 'master')
          .then(async (ok) => ok && (await Promise.all(live.map(agrees))).every(Boolean))
          .catch(() => false)
        if (promoted) break
        await sleep(50)
      }
      promotedAt = performance.now() - t0
      expect(promotedAt - killedAt, 'the replica was promoted').toBeLessThan(20_000)
      expect((await shardOf(survivor, slot)).master, 'the slot has moved to the replica').toBe(replica)

      // Traffic goes on until the closed key has met its limit again on the new master.
      const recoveryDeadline = performance.now() + 15_000
      const settled = () =>
        closedAnswers.some((answer) => answer.startedAt > promotedAt && answer.status === 429) &&
        openAnswers.filter((answer) => answer.startedAt > promotedAt && !answer.degraded).length >= 20
      while (!settled() && performance.now() < recoveryDeadline) await sleep(50)
    } finally {
      stopping = true
      await traffic
    }

    // 1. Every request was answered within the budget's bound, per onStoreFailure.
    const slowest = (answers: Answer[]) => Math.max(...answers.map((answer) => answer.millis))
    expect(slowest(closedAnswers), 'slowest answer of the closed gateway').toBeLessThan(ANSWER_WITHIN_MILLIS)
    expect(slowest(openAnswers), 'slowest answer of the open gateway').toBeLessThan(ANSWER_WITHIN_MILLIS)
    expect(new Set(openAnswers.map((answer) => answer.status)), 'open gateway statuses').toEqual(new Set([200]))
    for (const answer of closedAnswers) {
      expect([200, 429, 503], 'closed gateway status').toContain(answer.status)
      if (answer.status === 503) expect(answer.code).toBe('service_unavailable')
    }
    const before = closedAnswers.filter((answer) => answer.startedAt + answer.millis < killedAt && answer.status === 200)

    // 2. After the promotion (the whole cluster names the replica as the slot's master) each gateway
    // is back on Redis, and once back it does not fail again. Its first decision there may wait up
    // to the 1 s for which a gateway skips Redis after a failure, plus a refresh of the slot map.
    const afterPromotion = closedAnswers.filter((answer) => answer.startedAt > promotedAt).sort((a, b) => a.startedAt - b.startedAt)
    const firstDecision = afterPromotion.findIndex((answer) => answer.status !== 503)
    expect(firstDecision, 'the closed gateway decided on Redis again').toBeGreaterThanOrEqual(0)
    const closedBack = afterPromotion[firstDecision]!
    expect(closedBack.startedAt - promotedAt, 'closed gateway back on Redis after the promotion').toBeLessThan(RECOVERY_WITHIN_MILLIS)
    expect(afterPromotion.slice(firstDecision).filter((answer) => answer.status === 503)).toEqual([])
    const openAfter = openAnswers.filter((answer) => answer.startedAt > promotedAt)
    const openFirst = openAfter.findIndex((answer) => !answer.degraded)
    expect(openFirst, 'the open gateway decided on Redis again').toBeGreaterThanOrEqual(0)
    const openBack = openAfter[openFirst]!
    expect(openBack.startedAt - promotedAt, 'open gateway back on Redis after the promotion').toBeLessThan(RECOVERY_WITHIN_MILLIS)
    // Once back it goes to Redis for every request. On a loaded machine (the whole suite on two
    // cores) a reply may still come later than the 50 ms budget and that one request is decided by
    // the fallback (seen once in CI: 64 ms); a gateway still skipping Redis would answer at once.
    const fallbackOnceBack = openAfter.slice(openFirst).filter((answer) => answer.degraded)
    expect(fallbackOnceBack.filter((answer) => answer.millis < open.config.redis.commandTimeoutMillis), 'skipped Redis once back').toEqual([])
    expect(fallbackOnceBack.length, 'replies later than the budget once back').toBeLessThanOrEqual(2)

    // 3. Over-admission. Replication is asynchronous, so the promoted replica may miss the
    // increments of scripts the master ran just before it died. Redis writes a script's effects
    // to the replica link in the same event-loop turn as the reply, so only scripts whose
    // replies were still in flight can be missing: at most the CONCURRENCY requests in flight on
    // this key. Everything the closed gateway admitted over the whole run therefore fits in
    // LIMIT + CONCURRENCY (the test runs well inside one minute, so nothing leaves the window).
    const admittedTotal = closedAnswers.filter((answer) => answer.status === 200).length
    // What the new master counted at the first decision after the failover, against what the old one had admitted.
    const admittedBeforeKill = before.length
    const countedAfter = closedBack.status === 200 ? LIMIT - closedBack.remaining - 1 : undefined
    const netLost = countedAfter === undefined ? undefined : Math.max(0, admittedBeforeKill - countedAfter)
    // Everything needed to tell a lost replication stream from a counting fault, should this fail.
    const refusedAfter = closedAnswers.filter((answer) => answer.startedAt > promotedAt && answer.status === 429).map((answer) => answer.code)
    const timeline =
      `${admittedBeforeKill} admitted before the kill at ${Math.round(killedAt)} ms, promoted at ${Math.round(promotedAt)} ms, ` +
      `first decision on the new master at ${Math.round(closedBack.startedAt)} ms: ${closedBack.status} with remaining ${closedBack.remaining}; ` +
      `429s after it: ${JSON.stringify([...new Set(refusedAfter)])} × ${refusedAfter.length}; ` +
      `admitted at (ms, remaining): ${JSON.stringify(closedAnswers.filter((answer) => answer.status === 200).map((answer) => [Math.round(answer.startedAt), answer.remaining]))}`
    expect(refusedAfter, `the limit met again after the failover; ${timeline}`).toContain('rate_limited')
    expect(admittedTotal, `admitted over the whole run; ${timeline}`).toBeLessThanOrEqual(LIMIT + CONCURRENCY)
    if (netLost !== undefined) expect(netLost, `increments the promoted replica missed; ${timeline}`).toBeLessThanOrEqual(CONCURRENCY)

    const during = closedAnswers.filter((answer) => answer.startedAt >= killedAt && answer.startedAt < closedBack.startedAt)
    const ms = (millis: number) => `${Math.round(millis)} ms`
    recordScenario({
      area: 'Redis',
      scenario: `Redis Cluster (3 masters, 1 replica each): the master holding the keys SIGKILLed with ${CONCURRENCY} requests in flight, once its replica had caught up`,
      answered:
        `replica promoted ${ms(promotedAt - killedAt)} after the kill; closed gateway: ${during.filter((answer) => answer.status === 503).length} × 503 ` +
        `service_unavailable meanwhile, back on Redis ${ms(closedBack.startedAt - promotedAt)} after the promotion; open gateway: ` +
        `${openAnswers.length} × 200, ${openAnswers.filter((answer) => answer.degraded).length} on per-process limits, back on Redis ` +
        `${ms(openBack.startedAt - promotedAt)} after the promotion; slowest answer ${ms(Math.max(slowest(closedAnswers), slowest(openAnswers)))} ` +
        `(budget 50 ms; bound asserted ${ANSWER_WITHIN_MILLIS} ms); no failure after the first decision on the new master`,
      lost:
        `${admittedTotal} admitted on a limit of ${LIMIT} (bound ${LIMIT} + ${CONCURRENCY} in flight); ` +
        (netLost === undefined ? 'window count after failover not read' : `${netLost} un-replicated increments (${admittedBeforeKill} admitted before the kill)`),
      test: 'test/reliability/faults/redisCluster.int.test.ts',
    })
  }, 60_000)
})
