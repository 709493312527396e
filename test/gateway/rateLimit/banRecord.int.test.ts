import pino from 'pino'
import type pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate } from '../../../common/src/database/migrate.ts'
import { createPool } from '../../../common/src/database/pool.ts'
import { hashApiKey } from '../../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository, type KeyRepository } from '../../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../../gateway/src/migrations.ts'
import { banJournal } from '../../../gateway/src/rateLimit/banJournal.ts'
import { captureLog } from '../../helpers/logCapture.ts'
import { cuttableRelay } from '../../helpers/tcpRelay.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { runKeysCli } from '../../scripts/processes.ts'

/**
 * A ban begins on the gateway whose request started it, in Redis; the record `keys show` reads is
 * written to Postgres afterwards. Found in a chaos soak: a ban that began while Postgres was
 * restarting was never recorded, so `keys show` said `ban none` for the whole ban while every
 * gateway answered 429 api_key_banned.
 */
describe('the record of a ban that began while Postgres was unreachable', () => {
  const database = suiteDatabase()
  let relay: Awaited<ReturnType<typeof cuttableRelay>>
  let direct: pg.Pool
  let behindRelay: pg.Pool
  let repository: KeyRepository

  beforeAll(async () => {
    direct = createPool({ connectionString: database.url, applicationName: 'ban-record-test', max: 2 })
    await migrate(direct, GATEWAY_MIGRATIONS)
    repository = createKeyRepository(direct)
    const target = new URL(database.url)
    relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    behindRelay = createPool({ connectionString: relayUrl(), applicationName: 'ban-record-gateway', max: 2 })
  })
  const relayUrl = () => {
    const url = new URL(database.url)
    url.host = `127.0.0.1:${relay.port}`
    return url.toString()
  }
  afterAll(async () => {
    await behindRelay?.end()
    await relay?.close()
    await direct?.end()
  })

  const banWhileCut = async (keyId: string) => {
    const log = captureLog()
    const journal = banJournal({ record: createKeyRepository(behindRelay).recordBan, logger: pino(log.stream), retryMillis: 100 })
    await relay.cut()
    const now = Date.now()
    journal({ keyId, plan: 'free', step: 1, startedAtMillis: now, endsAtMillis: now + 300_000, shared: true })
    await new Promise((resolve) => setTimeout(resolve, 500))
    return log
  }
  const show = async (id: string) => {
    const env: NodeJS.ProcessEnv = { ...process.env, DATABASE_URL: database.url }
    delete env.GATEWAY_CONFIG
    delete env.DATA_DIR
    const run = await runKeysCli(['show', id, '--json'], env, 20_000)
    expect(run.code, run.stderr).toBe(0)
    return JSON.parse(run.stdout) as { ban: { step: number } | null }
  }

  it('keys show prints a ban that began while Postgres was unreachable, once Postgres is back', async () => {
    const { record } = await repository.create({ name: 'banned during a restart', plan: 'free' })
    const log = await banWhileCut(record.id)
    expect(log.entries().filter((line) => String(line.msg).startsWith('could not record the ban for the keys CLI'))).toHaveLength(1)
    await relay.restore()

    const deadline = Date.now() + 5_000
    while (!(await repository.activeBans([record.id])).has(record.id) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect((await show(record.id)).ban).toMatchObject({ step: 1 })
  }, 30_000)

  it('keys show prints no ban for one an unban lifted before its record could be written', async () => {
    const { record } = await repository.create({ name: 'unbanned during a restart', plan: 'free' })
    const log = await banWhileCut(record.id)
    // The operator unbans meanwhile, and a gateway whose Redis is reachable applies it.
    const unban = await repository.requestUnban(record.id)
    await repository.markUnbanApplied(unban!)
    await relay.restore()

    await new Promise((resolve) => setTimeout(resolve, 1_000))
    expect((await show(record.id)).ban).toBeNull()
    // The log says what keys show says: no record, and why.
    const after = log.entries().map((line) => String(line.msg)).filter((msg) => msg.startsWith('ban ') && msg.includes('keys CLI'))
    expect(after).toEqual(['ban not recorded for the keys CLI: an unban applied since has lifted it'])
  }, 30_000)

  it('keys show prints the newer ban when the write of an older one lands after its record', async () => {
    const { record } = await repository.create({ name: 'banned again while a record was late', plan: 'free' })
    const now = Date.now()
    // Ban 2 (step 1) began as ban 1 ended, and its gateway recorded it at once.
    await repository.recordBan({ keyId: record.id, step: 1, startedAt: new Date(now - 1_000), endsAt: new Date(now + 29_000) })
    // Ban 1's record, tried again while Postgres refused it, lands only now.
    const late = await repository.recordBan({ keyId: record.id, step: 0, startedAt: new Date(now - 4_000), endsAt: new Date(now - 1_000) }, performance.now() - 4_000, true)
    expect((await show(record.id)).ban).toMatchObject({ step: 1 })
    expect(late).toBe('overtaken')
  }, 30_000)

  it('stops writing the record of a ban whose key is deleted while Postgres refuses it, with one line saying why', async () => {
    const { record } = await repository.create({ name: 'deleted while banned', plan: 'free' })
    const log = captureLog()
    let writes = 0
    const recordBan = createKeyRepository(behindRelay).recordBan
    const journal = banJournal({
      record: (...args) => {
        writes++
        return recordBan(...args)
      },
      logger: pino(log.stream),
      retryMillis: 100,
    })
    await relay.cut()
    const now = Date.now()
    journal({ keyId: record.id, plan: 'free', step: 0, startedAtMillis: now, endsAtMillis: now + 300_000, shared: true })
    await direct.query('DELETE FROM gateway.api_keys WHERE id = $1', [record.id])
    await relay.restore()

    const gone = 'ban not recorded for the keys CLI: the key no longer exists'
    const deadline = Date.now() + 5_000
    while (!log.entries().some((line) => line.msg === gone) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50))
    const writesThen = writes
    await new Promise((resolve) => setTimeout(resolve, 500))
    expect(writes).toBe(writesThen)
    expect(log.entries().filter((line) => String(line.msg).startsWith('ban ')).map((line) => line.msg)).toEqual([gone])
  }, 30_000)

  it("records a ban while an operator's open transaction has updated the key's row", async () => {
    const { record } = await repository.create({ name: 'updated in an open transaction', plan: 'free' })
    // The gateway's pool, with a short statement timeout: a record waiting for the row fails soon.
    const gateway = createPool({ connectionString: database.url, applicationName: 'ban-record-gateway', max: 2, statementTimeoutMillis: 1_000 })
    const operator = await direct.connect()
    try {
      await operator.query('BEGIN')
      await operator.query(`UPDATE gateway.api_keys SET name = 'renamed, not committed yet' WHERE id = $1`, [record.id])
      const now = Date.now()
      await createKeyRepository(gateway).recordBan({ keyId: record.id, step: 0, startedAt: new Date(now), endsAt: new Date(now + 60_000) })
      expect((await show(record.id)).ban).toMatchObject({ step: 0 })
    } finally {
      await operator.query('ROLLBACK')
      operator.release()
      await gateway.end()
    }
  }, 30_000)

  it("looks up keys for requests while ban records wait for rows an operator's open transaction holds", async () => {
    const banned = await Promise.all([0, 1, 2, 3].map((n) => repository.create({ name: `banned ${n}, row held`, plan: 'free' })))
    const fresh = await repository.create({ name: 'not cached yet', plan: 'free' })
    // The gateway's pool, small: what a burst of bans would do to the default 10 connections.
    const applicationName = 'ban-record-gateway-held'
    const gateway = createPool({ connectionString: database.url, applicationName, max: 2, statementTimeoutMillis: 3_000 })
    const journal = banJournal({ record: createKeyRepository(gateway).recordBan, logger: pino({ level: 'silent' }), retryMillis: 100 })
    const operator = await direct.connect()
    try {
      await operator.query('BEGIN')
      // An operator about to delete the keys (or an admin tool) holds their rows: each record's foreign key check waits.
      await operator.query('SELECT 1 FROM gateway.api_keys WHERE id = ANY($1) FOR UPDATE', [banned.map(({ record }) => record.id)])
      const now = Date.now()
      for (const { record } of banned) journal({ keyId: record.id, plan: 'free', step: 0, startedAtMillis: now, endsAtMillis: now + 300_000, shared: true })
      const waiting = async () =>
        Number((await direct.query(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, [applicationName])).rows[0].count)
      const deadline = Date.now() + 5_000
      while ((await waiting()) === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50))
      expect(await waiting()).toBeGreaterThan(0)

      // The lookup a request for a key not cached yet makes, on the same pool: answered, not 503.
      expect(await createKeyRepository(gateway).findByHash(hashApiKey(fresh.key))).toMatchObject({ id: fresh.record.id })
    } finally {
      await operator.query('ROLLBACK')
      operator.release()
    }
    // Nothing lost meanwhile: every ban is recorded once the rows are free.
    const ids = banned.map(({ record }) => record.id)
    const deadline = Date.now() + 10_000
    while ((await repository.activeBans(ids)).size < ids.length && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100))
    expect((await repository.activeBans(ids)).size).toBe(ids.length)
    await gateway.end()
  }, 30_000)

  it('keys show prints no ban for one an unban lifted while its record waited its turn behind another', async () => {
    const held = await repository.create({ name: 'banned, row held', plan: 'free' })
    const unbanned = await repository.create({ name: 'banned, then unbanned while its record waited', plan: 'free' })
    const applicationName = 'ban-record-gateway-queued'
    const gateway = createPool({ connectionString: database.url, applicationName, max: 2, statementTimeoutMillis: 5_000 })
    const recordBan = createKeyRepository(gateway).recordBan
    const outcomes: string[] = []
    const journal = banJournal({
      record: async (...args) => {
        const outcome = await recordBan(...args)
        outcomes.push(outcome)
        return outcome
      },
      logger: pino({ level: 'silent' }),
      retryMillis: 100,
    })
    const operator = await direct.connect()
    try {
      await operator.query('BEGIN')
      await operator.query('SELECT 1 FROM gateway.api_keys WHERE id = $1 FOR UPDATE', [held.record.id])
      const now = Date.now()
      // The first record waits in Postgres for the held row, the second for its turn behind it.
      journal({ keyId: held.record.id, plan: 'free', step: 0, startedAtMillis: now, endsAtMillis: now + 300_000, shared: true })
      journal({ keyId: unbanned.record.id, plan: 'free', step: 0, startedAtMillis: now, endsAtMillis: now + 300_000, shared: true })
      const waiting = async () =>
        Number((await direct.query(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, [applicationName])).rows[0].count)
      const deadline = Date.now() + 5_000
      while ((await waiting()) === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50))
      expect(await waiting()).toBeGreaterThan(0)
      // The operator unbans the second key meanwhile, and a gateway applies it: there is no record yet to delete.
      const unban = await repository.requestUnban(unbanned.record.id)
      await repository.markUnbanApplied(unban!)
    } finally {
      await operator.query('ROLLBACK')
      operator.release()
    }
    const deadline = Date.now() + 10_000
    while (outcomes.length < 2 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50))
    await gateway.end()
    expect((await show(unbanned.record.id)).ban).toBeNull()
    expect((await show(held.record.id)).ban).toMatchObject({ step: 0 })
    expect(outcomes).toEqual(['recorded', 'lifted'])
  }, 30_000)

  it('a ban written again after its first write committed unseen is reported recorded, not overtaken by a newer ban', async () => {
    const { record } = await repository.create({ name: 'recorded, answer lost', plan: 'free' })
    const now = Date.now()
    const ban = { keyId: record.id, step: 0, startedAt: new Date(now), endsAt: new Date(now + 60_000) }
    const startedHere = performance.now()
    // The first write's statement reached Postgres slowly (its answer then lost); the retry's promptly.
    await relay.delay(300)
    const slow = createPool({ connectionString: relayUrl(), applicationName: 'ban-record-slow', max: 1 })
    try {
      expect(await createKeyRepository(slow).recordBan(ban, startedHere)).toBe('recorded')
    } finally {
      await slow.end()
      await relay.restore()
    }
    expect(await repository.recordBan(ban, startedHere, true)).toBe('recorded')
    expect((await show(record.id)).ban).toMatchObject({ step: 0 })
  }, 30_000)
})
