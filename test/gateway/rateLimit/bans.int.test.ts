import { pino } from 'pino'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createUnbanApplier, keyChangeHandler } from '../../../gateway/src/keys/applyKeyChange.ts'
import { backstopTimeoutMillis } from '../../../gateway/src/rateLimit/redisStore.ts'
import type { KeyChange } from '../../../gateway/src/keys/keyRepository.ts'
import type { RunningGateway } from '../../helpers/gateway.ts'
import { captureLog } from '../../helpers/logCapture.ts'
import { testKeyPrefix } from '../../helpers/redis.ts'
import type { PrivateRedis } from '../../helpers/redisServer.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { runKeysCli } from '../../scripts/processes.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, codeOf, eventually, expectRateLimitHeaders, expectTooManyRequests, keyed, sleep } from './httpLimits.ts'
import { startGatewaysSharingRedis, type SharedRedisGateways } from './sharedRedisGateways.ts'

describe('bans over HTTP, on two gateways sharing a private Redis', () => {
  const prefix = testKeyPrefix()
  const database = suiteDatabase()
  let redis: PrivateRedis
  let a: RunningGateway
  let b: RunningGateway
  const aLog = captureLog()
  const bLog = captureLog()

  /** `npm run keys -- <command> <id> --json` as an operator runs it against this database. */
  async function cli(command: 'show' | 'unban', id: string): Promise<{ ban: { step: number; startedAt: string; endsAt: string } | null; unban?: string }> {
    const { GATEWAY_CONFIG: _config, ...env } = process.env
    const run = await runKeysCli([command, id, '--json'], { ...env, DATABASE_URL: database.url }, 20_000)
    expect(run.code, run.stderr).toBe(0)
    return JSON.parse(run.stdout)
  }

  /** Strikes the key into a ban through gateway A; the ban's Retry-After. */
  async function banThroughA(key: string): Promise<number> {
    for (let sent = 0; sent < 10; sent++) {
      const response = await a.request('/v1/pets?limit=1', { key })
      const code = await codeOf(response)
      if (code === 'api_key_banned') return Number(response.headers.get('retry-after'))
      expect([undefined, 'rate_limited']).toContain(code)
    }
    throw new Error('no ban after 10 requests')
  }

  /**
   * `keys unban` while Redis refuses the gateways' scripts: their unban fails at once (nothing
   * waits in a socket to be run later), so the unban stays pending, and only the retry of pending
   * unbans can lift the ban (late, and then announced to every gateway).
   */
  async function unbanWhileRedisRefusesScripts(id: string): Promise<{ unban: Awaited<ReturnType<typeof cli>>; shown: Awaited<ReturnType<typeof cli>> }> {
    const admin = redis.admin()
    await admin.connect()
    try {
      await admin.call('ACL', 'SETUSER', 'default', '-@scripting')
      const unban = await cli('unban', id)
      expect(unban).toMatchObject({ unban: 'pending' })
      return { unban, shown: await cli('show', id) }
    } finally {
      await admin.call('ACL', 'SETUSER', 'default', '+@all')
      admin.disconnect()
    }
  }

  /** Script calls Redis has run so far: every rate-limit decision is one of them. */
  async function scriptCalls(): Promise<number> {
    const [evalsha, plainEval] = await Promise.all([redis.commandCalls('evalsha'), redis.commandCalls('eval')])
    return evalsha.calls + plainEval.calls
  }

  let shared: SharedRedisGateways | undefined
  beforeAll(async () => {
    shared = await startGatewaysSharingRedis(database.url, { prefix, ladder: ['4s', '30s'], logStreams: [aLog.stream, bLog.stream] })
    ;({ redis, a, b } = shared)
  })
  afterAll(async () => {
    await shared?.close()
  })

  let banned: { key: string; id: string }

  it('bans a key that keeps sending while limited, holds the ban on both gateways without Redis, and lets it lapse on time', async () => {
    banned = await a.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    const { key } = banned
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    for (let i = 0; i < 2; i++) expect((await send(a)).status).toBe(200)
    await expectTooManyRequests(await send(a), 'rate_limited')
    await expectTooManyRequests(await send(a), 'rate_limited')
    const first = await send(a)
    const view = expectRateLimitHeaders(first, keyed)
    expect(view.remaining).toBe(0)
    expect(view.current.get('minute')?.r).toBe(0)
    expect(view.current.get('day')?.r).toBe(0)
    expect(await expectTooManyRequests(first, 'api_key_banned')).toBe(4)

    // Gateway A started the ban: it says so in its log and records it where the keys CLI reads it.
    expect(aLog.entries().filter((entry) => entry.msg === 'API key banned')).toEqual([
      expect.objectContaining({ level: 40, keyId: banned.id, plan: 'enterprise', step: 0, seconds: 4 }),
    ])
    await eventually(async () => (await a.keys.activeBans([banned.id])).has(banned.id), 2_000)
    const recorded = (await a.keys.activeBans([banned.id])).get(banned.id)
    expect(recorded?.step).toBe(0)
    expect((recorded?.endsAt.getTime() ?? 0) - (recorded?.startedAt.getTime() ?? 0)).toBe(4_000)

    // Gateway B learns of the ban from Redis on its first request for the key.
    await expectTooManyRequests(await send(b), 'api_key_banned')

    // From now on both answer from their ban caches: not one script call reaches Redis.
    const before = await scriptCalls()
    for (let i = 0; i < 10; i++) {
      for (const gateway of [a, b]) {
        const response = await send(gateway)
        expectRateLimitHeaders(response, keyed)
        const retryAfter = await expectTooManyRequests(response, 'api_key_banned')
        expect(retryAfter).toBeLessThanOrEqual(4)
      }
    }
    expect(await scriptCalls()).toBe(before)

    // And with Redis frozen the banned answer still comes at once (a Redis call would have
    // waited out the budget and then been admitted by the per-process fallback).
    redis.freeze()
    try {
      for (const gateway of [a, b]) {
        const started = performance.now()
        const response = await send(gateway)
        expect(performance.now() - started).toBeLessThan(500)
        const retryAfter = await expectTooManyRequests(response, 'api_key_banned')
        expect(retryAfter).toBeGreaterThanOrEqual(1)
      }
    } finally {
      redis.thaw()
    }

    // Waiting out Retry-After from the last banned answer: neither gateway still says banned.
    const last = await send(b)
    const retryAfter = await expectTooManyRequests(last, 'api_key_banned')
    await sleep(retryAfter * 1_000)
    for (const gateway of [a, b]) {
      const response = await send(gateway)
      expect(await codeOf(response), `gateway ${gateway === a ? 'A' : 'B'} after the ban`).not.toBe('api_key_banned')
    }
  })

  // A request is admitted again when the day window frees, on a bucket's edge (a whole second),
  // after the 4 s ban. Carried on the local clock, that moment came back a reply's latency late,
  // and the cache said the second after it, while the gateways that asked Redis said that second.
  // X-RateLimit-Limit too stays the day's, the window that held the key back: with both windows
  // spent to the same moment during a ban, it gave the minute's limit (5) after the 429s' day (2).
  it('answers a ban from its cache with the X-RateLimit-Reset Redis gave, when the day window frees after the ban ends, naming the day window as its 429s did', async () => {
    const { key } = await a.createKey({ plan: 'enterprise', perMinute: 5, perDay: 2 })
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    for (let i = 0; i < 2; i++) expect((await send(a)).status).toBe(200)
    for (let i = 0; i < 2; i++) {
      const limited = await send(a)
      await expectTooManyRequests(limited, 'rate_limited')
      expect(expectRateLimitHeaders(limited, keyed).limit).toBe(2)
    }
    const fromRedis = await send(a)
    await expectTooManyRequests(fromRedis, 'api_key_banned')
    const { reset, limit } = expectRateLimitHeaders(fromRedis, keyed)
    expect(limit).toBe(2)
    // B asks Redis once, then both answer from their caches.
    for (let i = 0; i < 3; i++) {
      for (const gateway of [a, b]) {
        const response = await send(gateway)
        await expectTooManyRequests(response, 'api_key_banned')
        const view = expectRateLimitHeaders(response, keyed)
        expect([view.reset, view.limit], `gateway ${gateway === a ? 'A' : 'B'}, round ${i}`).toEqual([reset, 2])
      }
    }
  })

  it('climbs the ladder on the next ban, and keys unban lifts it on both gateways within 2 s', async () => {
    // The key banned (and released) by the previous test: its next ban is the ladder's second step.
    const { key, id } = banned
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    expect(await banThroughA(key)).toBe(30)
    await expectTooManyRequests(await send(b), 'api_key_banned')
    await expectTooManyRequests(await send(a), 'api_key_banned')
    await eventually(async () => (await a.keys.activeBans([id])).get(id)?.step === 1, 2_000)
    const shown = await cli('show', id)
    expect(shown.ban).toMatchObject({ step: 1 })
    expect(Date.parse(shown.ban?.endsAt ?? '') - Date.parse(shown.ban?.startedAt ?? '')).toBe(30_000)

    expect(await cli('unban', id)).toMatchObject({ unban: 'applied', ban: null })
    // Each gateway is polled until it stops answering banned; a poll that reaches Redis while the
    // window is still full is one strike, two at most in all, below the three that would ban again.
    await Promise.all(
      [a, b].map((gateway) =>
        eventually(async () => (await codeOf(await send(gateway))) !== 'api_key_banned', 2_000),
      ),
    )
    // Once the window has room again the key is simply admitted, on both.
    await sleep(3_000)
    for (const gateway of [a, b]) expect((await send(gateway)).status).toBe(200)
    // Both gateways applied the unban; one of them says so.
    const said = [...aLog.entries(), ...bLog.entries()].filter((entry) => entry.msg === 'API key unbanned' && entry.keyId === id)
    expect(said).toHaveLength(1)
  })

  it('keys unban of a key with no ban on record says so rather than claiming it lifted one', async () => {
    const { id, key } = await a.createKey({ plan: 'free' })
    const { GATEWAY_CONFIG: _config, ...env } = process.env
    const run = await runKeysCli(['unban', id], { ...env, DATABASE_URL: database.url }, 20_000)
    expect(run.code, run.stderr).toBe(0)
    expect(run.stdout).toMatch(new RegExp(`^API key ${id} had no ban on record; a gateway cleared its strikes`))
    expect((await a.request('/v1/pets?limit=1', { key })).status).toBe(200)
  })

  it('an unban requested while Redis cannot take it is applied once it can, on both gateways', async () => {
    const { key, id } = banned
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    expect(await banThroughA(key)).toBe(30)
    await expectTooManyRequests(await send(b), 'api_key_banned')

    const { unban, shown } = await unbanWhileRedisRefusesScripts(id)
    expect(unban).toMatchObject({ ban: { step: 1 } })
    expect(shown).toMatchObject({ ban: { step: 1 } })
    // The pending unban is retried every 2 s once a few seconds old, and once applied it is
    // announced to both gateways, whose caches may have learnt the ban again meanwhile.
    await Promise.all(
      [a, b].map((gateway) => eventually(async () => (await codeOf(await send(gateway))) !== 'api_key_banned', 10_000, 250)),
    )
    expect((await cli('show', id)).ban).toBeNull()
    expect(await a.keys.pendingUnbans()).toEqual([])
  })

  it('an unban a second gateway applies after the key was banned again leaves that ban in place', async () => {
    const { key, id } = await a.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    expect(await banThroughA(key)).toBe(4)
    await eventually(async () => (await a.keys.activeBans([id])).has(id), 2_000)
    expect(await cli('unban', id)).toMatchObject({ unban: 'applied', ban: null })
    const [unban] = (
      await a.pool.query<KeyChange>(
        `SELECT id, key_id AS "keyId", key_hash AS "keyHash", kind, false AS applied
           FROM gateway.api_key_changes WHERE key_id = $1 AND kind = 'unban'`,
        [id],
      )
    ).rows
    // Both gateways have taken the unban from the feed by now.
    await sleep(500)

    // The key keeps sending and earns its next ban after the unban was lifted.
    expect(await banThroughA(key)).toBe(30)
    await eventually(async () => (await a.keys.activeBans([id])).get(id)?.step === 1, 2_000)

    // Gateway B applies the same unban only now, as read from the feed before it was marked (its
    // Redis further away than A's): a repeat of an unban already applied, it lifts nothing.
    const applier = createUnbanApplier({ repository: b.keys, limiter: b.limiter, logger: pino({ level: 'silent' }) })
    keyChangeHandler(b.cache, applier)(unban!)
    await applier.stop()
    for (const gateway of [b, a]) await expectTooManyRequests(await send(gateway), 'api_key_banned')
    expect(await cli('show', id)).toMatchObject({ ban: { step: 1 } })
  })

  it("an unban Redis ran after the gateways' calls had failed (it was frozen past their timeout) is logged by one gateway", async () => {
    const { key, id } = await a.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    expect(await banThroughA(key)).toBe(4)
    await eventually(async () => (await a.keys.activeBans([id])).has(id), 2_000)
    const unbannedLines = () =>
      [...aLog.entries(), ...bLog.entries()].filter((entry) => entry.msg === 'API key unbanned' && entry.keyId === id)
    // Both gateways send the unban into the frozen server's socket; their calls fail at the
    // backstop timeout, and Redis runs the commands when it wakes: the ban is lifted, unseen.
    redis.freeze()
    try {
      expect(await cli('unban', id)).toMatchObject({ unban: 'pending' })
      await sleep(backstopTimeoutMillis(EXACT_OUTCOME_BUDGET_MILLIS) + 1_000)
    } finally {
      redis.thaw()
    }
    // The pending unban's retry finds it applied in Redis already, and marks it applied.
    await eventually(async () => (await a.keys.pendingUnbans()).length === 0 && (await cli('show', id)).ban === null, 15_000, 500)
    await eventually(async () => (await codeOf(await send(b))) !== 'api_key_banned', 5_000, 250)
    // The operator's log says once that the key was unbanned, as for an unban applied at once.
    await sleep(1_000)
    expect(unbannedLines()).toHaveLength(1)
  })

  it("a late unban's announcement, read after the key was banned again, leaves that ban in place", async () => {
    const { key, id } = await a.createKey({ plan: 'enterprise', perMinute: 2, perDay: 1_000 })
    const send = (gateway: RunningGateway) => gateway.request('/v1/pets?limit=1', { key })
    expect(await banThroughA(key)).toBe(4)
    await eventually(async () => (await a.keys.activeBans([id])).has(id), 2_000)
    // Unbanned while no gateway can take it (the 4 s ban may lapse meanwhile): pending, then lifted late.
    await unbanWhileRedisRefusesScripts(id)
    // The gateway that applies it late appends an applied copy to the log, for every gateway's cache.
    const unbans = async () =>
      (
        await a.pool.query<KeyChange>(
          `SELECT id, key_id AS "keyId", key_hash AS "keyHash", kind, applied_at IS NOT NULL AS applied
             FROM gateway.api_key_changes WHERE key_id = $1 AND kind = 'unban' ORDER BY id`,
          [id],
        )
      ).rows
    await eventually(async () => (await unbans()).filter((change) => change.applied).length === 2, 10_000, 250)
    const announcement = (await unbans()).at(-1)!

    // The key keeps sending and earns its next ban after the unban was lifted.
    await sleep(2_000)
    expect(await banThroughA(key)).toBe(30)
    await eventually(async () => (await a.keys.activeBans([id])).get(id)?.step === 1, 2_000)

    // A gateway whose change feed reads the announcement only now (behind a transaction pooler its
    // feed reads the log every second): it forgets what it holds, and lifts nothing in Redis.
    const applier = createUnbanApplier({ repository: b.keys, limiter: b.limiter, logger: pino({ level: 'silent' }) })
    keyChangeHandler(b.cache, applier)(announcement)
    await applier.stop()
    for (const gateway of [b, a]) await expectTooManyRequests(await send(gateway), 'api_key_banned')
    expect(await cli('show', id)).toMatchObject({ ban: { step: 1 } })
  })
})
