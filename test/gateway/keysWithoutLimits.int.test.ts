import { readFileSync, writeFileSync } from 'node:fs'
import type pg from 'pg'
import pino from 'pino'
import { parse, stringify } from 'yaml'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { loadGatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import { createKeyRepository, type KeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { warnOfKeysWithoutLimits } from '../../gateway/src/keys/keysWithoutLimits.ts'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { GATEWAY_MIGRATIONS } from '../../gateway/src/migrations.ts'
import { recordingUpstream } from '../helpers/fakeUpstreams.ts'
import { startGatewayProcess } from '../ops/gatewayProcess.ts'
import { killAll, waitForOutput } from '../scripts/processes.ts'
import { captureLog } from '../helpers/logCapture.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

// A plan removed from the config (or renamed) while keys still used it left those keys on the
// strictest limits of the plans left, more than a removed plan stricter than free allowed, and
// nothing said so: the operator learned it from the customers.
describe('keys the config gives no limits, said at start and after each reload', () => {
  const database = suiteDatabase()
  let pool: pg.Pool
  let repository: KeyRepository
  const shipped = loadGatewayConfig('config/gateway.yaml', {}, undefined, { tlsFiles: false })

  beforeAll(async () => {
    pool = createPool({ connectionString: database.url, applicationName: 'plans-in-force-test', max: 2 })
    await migrate(pool, GATEWAY_MIGRATIONS)
    repository = createKeyRepository(pool)
  })
  afterAll(async () => {
    await pool?.end()
  })

  async function warnings() {
    const log = captureLog()
    await warnOfKeysWithoutLimits(repository, shipped, pino(log.stream))
    return log.entries()
  }

  it('names, by plan, the usable keys on a plan the config lacks or on a custom plan without limits of their own', async () => {
    expect(await warnings()).toEqual([])
    await repository.create({ name: 'on a plan the config has', plan: 'free' })
    await repository.create({ name: 'enterprise with its limits', plan: 'enterprise', perMinute: 100, perDay: 1_000 })
    expect(await warnings()).toEqual([])

    const usable = [
      await repository.create({ name: 'starter 1', plan: 'starter' }),
      await repository.create({ name: 'starter 2', plan: 'starter' }),
      await repository.create({ name: 'enterprise without limits', plan: 'enterprise' }),
    ]
    // Its own limits replace its plan's, whatever the plan: nothing to say about it.
    usable.push(await repository.create({ name: 'starter with its own limits', plan: 'starter', perMinute: 50, perDay: 500 }))
    const revoked = await repository.create({ name: 'starter revoked', plan: 'starter' })
    await repository.revoke(revoked.record.id)
    await repository.create({ name: 'starter expired', plan: 'starter', expiresInMillis: -1_000 })
    const found = await warnings()
    // Out of the next test's way: its gateway must find no such key at start.
    for (const { record } of usable) await repository.revoke(record.id)
    expect(found).toEqual([
      expect.objectContaining({
        level: 40,
        keys: { enterprise: 1, starter: 2 },
        msg: expect.stringMatching(/^keys whose limits the config does not give .* get the strictest limits of any plan: define the plan again, or move them/),
      }),
    ])
  })

  it('a gateway process says so after a reload that removed a plan its keys use, not before', async () => {
    const starter = await repository.create({ name: 'on starter', plan: 'starter-plus' })
    const upstream = await recordingUpstream()
    const gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      env: { LOG_LEVEL: 'info' },
      configure: (file) => {
        ;(file.plans as Record<string, { perMinute: number; perDay: number }>)['starter-plus'] = { perMinute: 10, perDay: 100 }
      },
    })
    try {
      // The check at start runs once the gateway serves; the reload's own line comes after it.
      const file = parse(readFileSync(gateway.configPath, 'utf8')) as GatewayConfigFile
      delete (file.plans as Record<string, unknown>)['starter-plus']
      writeFileSync(gateway.configPath, stringify(file))
      gateway.proc.child.kill('SIGHUP')
      await waitForOutput(gateway.proc, 'keys whose limits the config does not give', 15_000)
      const lines = gateway.proc
        .output()
        .split('\n')
        .filter((line) => line.startsWith('{'))
        .map((line) => JSON.parse(line) as { msg?: string; keys?: Record<string, number> })
      const reloadedAt = lines.findIndex((line) => line.msg === 'gateway config reloaded')
      const warned = lines.findIndex((line) => line.msg?.startsWith('keys whose limits the config does not give') === true)
      expect(reloadedAt).toBeGreaterThanOrEqual(0)
      expect(warned).toBeGreaterThan(reloadedAt)
      expect(lines[warned]!.keys).toMatchObject({ 'starter-plus': 1 })
      expect(lines.filter((line) => line.msg?.startsWith('keys whose limits') === true)).toHaveLength(1)
    } finally {
      await repository.revoke(starter.record.id)
      await killAll()
      gateway.cleanup()
      await upstream.close()
    }
  }, 60_000)

  it('says it could not check, and goes on, when Postgres cannot answer', async () => {
    const log = captureLog()
    // Nothing listens on port 1: the repository's query is refused, as by a Postgres that is down.
    const unreachable = createPool({ connectionString: 'postgres://postgres@127.0.0.1:1/none', applicationName: 'plans-in-force-test', max: 1 })
    try {
      await warnOfKeysWithoutLimits(createKeyRepository(unreachable), shipped, pino(log.stream))
    } finally {
      await unreachable.end()
    }
    expect(log.entries()).toEqual([expect.objectContaining({ level: 40, msg: 'could not check which keys the config gives no limits' })])
  })
})
