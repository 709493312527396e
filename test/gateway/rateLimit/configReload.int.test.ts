import { mkdtempSync, readFileSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import type { FastifyInstance } from 'fastify'
import { pino } from 'pino'
import type pg from 'pg'
import { Registry } from 'prom-client'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { parseDocument } from 'yaml'
import { migrate } from '../../../common/src/database/migrate.ts'
import { createPool } from '../../../common/src/database/pool.ts'
import { buildGateway } from '../../../gateway/src/app.ts'
import { createConfigSource, type ConfigSource } from '../../../gateway/src/config/configSource.ts'
import { generateApiKey } from '../../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyCache, type KeyCache } from '../../../gateway/src/keys/keyCache.ts'
import { createKeyRepository } from '../../../gateway/src/keys/keyRepository.ts'
import { GATEWAY_MIGRATIONS } from '../../../gateway/src/migrations.ts'
import { createLimiter, type Limiter } from '../../../gateway/src/rateLimit/limiter.ts'
import { contractFetch } from '../../helpers/contract.ts'
import { TEST_INTERNAL_TOKEN, startPetsService, type RunningPetsService } from '../../helpers/petsService.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../../helpers/redis.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { EXACT_OUTCOME_BUDGET_MILLIS, anonymous, eventually, expectRateLimitHeaders, keyed } from './httpLimits.ts'

const silent = pino({ level: 'silent' })

/** A private copy of config/gateway.yaml that the test edits like an operator would. */
function configCopy(directory: string, prefix: string) {
  const file = path.join(directory, 'gateway.yaml')
  const edit = (change: (document: ReturnType<typeof parseDocument>) => void) => {
    const document = parseDocument(readFileSync(file, 'utf8'))
    change(document)
    writeFileSync(file, String(document))
  }
  writeFileSync(file, readFileSync('config/gateway.yaml', 'utf8'))
  edit((document) => {
    document.setIn(['redis', 'keyPrefix'], prefix)
    document.setIn(['redis', 'commandTimeoutMillis'], EXACT_OUTCOME_BUDGET_MILLIS)
  })
  return {
    file,
    edit,
    /** Replaces the file's text outright (for edits that are not YAML at all). */
    write: (text: string) => writeFileSync(file, text),
    read: () => readFileSync(file, 'utf8'),
  }
}

describe('config source: reload keeps a valid config in force', () => {
  let directory: string
  let source: ConfigSource
  let copy: ReturnType<typeof configCopy>
  const outcomes: string[] = []
  let stopWatching: (() => void) | undefined

  beforeAll(() => {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-config-'))
    copy = configCopy(directory, 'unused:')
    source = createConfigSource(copy.file, {}, silent, (outcome) => outcomes.push(outcome))
  })
  afterEach(() => {
    stopWatching?.()
    stopWatching = undefined
  })
  afterAll(() => rmSync(directory, { recursive: true, force: true }))

  it('a valid edit changes the plan limits on reload', () => {
    expect(source.get().plans.free).toEqual({ perMinute: 60, perDay: 1_000 })
    copy.edit((document) => document.setIn(['plans', 'free', 'perMinute'], 5))
    expect(source.reload()).toBe(true)
    expect(source.get().plans.free).toEqual({ perMinute: 5, perDay: 1_000 })
    expect(outcomes.at(-1)).toBe('success')
  })

  it('an invalid edit keeps the running config and reload returns false', () => {
    const running = source.get()
    copy.edit((document) => document.setIn(['plans', 'free', 'perMinute'], 'lots'))
    expect(source.reload()).toBe(false)
    expect(source.get()).toBe(running)
    expect(outcomes.at(-1)).toBe('failure')
    copy.edit((document) => document.setIn(['plans', 'free', 'perMinut'], 5))
    expect(source.reload()).toBe(false)
    copy.write('plans: [this is: not, the config')
    expect(source.reload()).toBe(false)
    expect(source.get()).toBe(running)
    expect(source.get().plans.free?.perMinute).toBe(5)
  })

  it('a watched file is reloaded when it changes, without a signal', async () => {
    copy.write(readFileSync('config/gateway.yaml', 'utf8'))
    expect(source.reload()).toBe(true)
    stopWatching = source.watch()
    copy.edit((document) => document.setIn(['plans', 'pro', 'perMinute'], 7))
    // Make sure the modification time moves even on a coarse-grained file system.
    const later = new Date(Date.now() + 2_000)
    utimesSync(copy.file, later, later)
    // Polled every 500 ms; the bound is generous because CI machines are loaded.
    await eventually(async () => source.get().plans.pro?.perMinute === 7, 10_000)
  })

  it('a change made between the last read and the start of watching is not missed', async () => {
    stopWatching?.()
    copy.write(readFileSync('config/gateway.yaml', 'utf8'))
    expect(source.reload()).toBe(true)
    copy.edit((document) => document.setIn(['plans', 'pro', 'perMinute'], 11))
    const later = new Date(Date.now() + 4_000)
    utimesSync(copy.file, later, later)
    stopWatching = source.watch()
    await eventually(async () => source.get().plans.pro?.perMinute === 11, 10_000)
  })

  it('a new file renamed over the watched one is reloaded even when it carries the same modification time (cp -p, rsync -a)', async () => {
    copy.write(readFileSync('config/gateway.yaml', 'utf8'))
    const sameTime = new Date(Date.now() - 60_000)
    utimesSync(copy.file, sameTime, sameTime)
    expect(source.reload()).toBe(true)
    stopWatching = source.watch()
    // Past the watcher's first poll, so it compares the replacement with the file it started on.
    await new Promise((resolve) => setTimeout(resolve, 1_500))
    const replacement = path.join(directory, 'gateway.yaml.new')
    writeFileSync(replacement, readFileSync(copy.file, 'utf8').replace(/(pro: +\{ perMinute: )300/, '$1301'))
    utimesSync(replacement, sameTime, sameTime)
    renameSync(replacement, copy.file)
    await eventually(async () => source.get().plans.pro?.perMinute === 301, 10_000)
  })

  it('a file replaced by a tool that leaves it empty or missing for a moment is followed with no refused reload', async () => {
    copy.write(readFileSync('config/gateway.yaml', 'utf8'))
    expect(source.reload()).toBe(true)
    stopWatching = source.watch()
    await new Promise((resolve) => setTimeout(resolve, 1_200))
    const refusedBefore = outcomes.filter((outcome) => outcome === 'failure').length
    const pause = () => new Promise((resolve) => setTimeout(resolve, 1_200))
    const text = (perMinute: number) => readFileSync('config/gateway.yaml', 'utf8').replace(/(pro: +\{ perMinute: )300/, `$1${perMinute}`)

    // An editor writing in place: truncated, then written a poll or two later.
    copy.write('')
    process.kill(process.pid, 'SIGHUP')
    await pause()
    copy.write(text(302))
    await eventually(async () => source.get().plans.pro?.perMinute === 302, 10_000)
    // rm, then cp.
    rmSync(copy.file)
    await pause()
    copy.write(text(303))
    await eventually(async () => source.get().plans.pro?.perMinute === 303, 10_000)

    expect(outcomes.filter((outcome) => outcome === 'failure').length).toBe(refusedBefore)
  })

  it('a file whose folder went away past the wait and came back unchanged is read again: the refusal does not stand', async () => {
    copy.write(readFileSync('config/gateway.yaml', 'utf8'))
    expect(source.reload()).toBe(true)
    stopWatching = source.watch()
    await new Promise((resolve) => setTimeout(resolve, 1_200))
    outcomes.length = 0
    // A ConfigMap's folder swapped out and back, or a mount that dropped: the same inode returns.
    renameSync(directory, `${directory}.away`)
    try {
      await eventually(async () => outcomes.includes('failure'), 10_000)
    } finally {
      renameSync(`${directory}.away`, directory)
    }
    await eventually(async () => outcomes.at(-1) === 'success', 10_000)
  })

  it('a file left empty is a refused reload once it has had its moment to come back', async () => {
    copy.write(readFileSync('config/gateway.yaml', 'utf8'))
    expect(source.reload()).toBe(true)
    stopWatching = source.watch()
    await new Promise((resolve) => setTimeout(resolve, 1_200))
    const running = source.get()
    outcomes.length = 0
    copy.write('')
    await eventually(async () => outcomes.includes('failure'), 10_000)
    expect(outcomes).toEqual(['failure'])
    expect(source.get()).toBe(running)
  })
})

describe('a running gateway follows a config reload on its next request', () => {
  const prefix = suiteKeyPrefix()
  let directory: string
  let copy: ReturnType<typeof configCopy>
  const database = suiteDatabase()
  let pets: RunningPetsService
  let pool: pg.Pool
  let limiter: Limiter
  let cache: KeyCache
  let app: FastifyInstance
  let source: ConfigSource
  let url: string

  beforeAll(async () => {
    pets = await startPetsService(database.url)
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-config-'))
    copy = configCopy(directory, prefix)
    copy.edit((document) => document.setIn(['anonymous', 'perMinute'], 50))
    source = createConfigSource(copy.file, { REDIS_URL: TEST_REDIS_URL, PETS_URL: pets.url }, silent)
    // The gateway as main.ts assembles it: every stage reads the config through the source.
    pool = createPool({ connectionString: database.url, applicationName: 'gateway-reload-test' })
    await migrate(pool, GATEWAY_MIGRATIONS)
    limiter = createLimiter({ config: source.get, logger: silent })
    await limiter.ready()
    cache = createKeyCache(createKeyRepository(pool), source.get().keyCache)
    app = await buildGateway({
      config: source.get,
      keys: cache,
      limiter,
      internalToken: TEST_INTERNAL_TOKEN,
      logger: silent,
      registry: new Registry(),
    })
    await app.listen({ host: '127.0.0.1', port: 0 })
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  })
  afterAll(async () => {
    await app?.close()
    await limiter?.close()
    await pool?.end()
    await pets?.close()
    rmSync(directory, { recursive: true, force: true })
  })

  const request = (key?: string) =>
    // The shared client's contract check (test/helpers/contract.ts) covers this hand-built gateway too.
    contractFetch(`${url}/v1/pets?limit=1`, key ? { headers: { authorization: `Bearer ${key}` } } : {})

  it('new plan limits and a new anonymous limit apply at once; an invalid edit changes nothing', async () => {
    const { key } = await createKeyRepository(pool).create({ name: 'reload', plan: 'free' })
    const before = expectRateLimitHeaders(await request(key), keyed)
    expect(before).toMatchObject({ status: 200, limit: 60, remaining: 59 })
    expect(expectRateLimitHeaders(await request(), anonymous)).toMatchObject({ status: 401, limit: 50 })

    copy.edit((document) => {
      document.setIn(['plans', 'free', 'perMinute'], 3)
      document.setIn(['anonymous', 'perMinute'], 4)
    })
    expect(source.reload()).toBe(true)
    // The window keeps what it counted; only the limit moved.
    const after = expectRateLimitHeaders(await request(key), keyed)
    expect(after).toMatchObject({ status: 200, limit: 3, remaining: 1 })
    expect(after.policy.get('minute')).toEqual({ q: 3, w: 60 })
    expect(expectRateLimitHeaders(await request(), anonymous)).toMatchObject({ status: 401, limit: 4 })

    const text = copy.read()
    copy.write(text.replace('onStoreFailure: open', 'onStoreFailure: sometimes'))
    expect(source.reload()).toBe(false)
    const kept = expectRateLimitHeaders(await request(key), keyed)
    expect(kept).toMatchObject({ status: 200, limit: 3, remaining: 0 })
    expect((await request(key)).status).toBe(429)
  })

  it('an address keeps what it spent across a reload of the anonymous limit: no fresh allowance of key lookups', async () => {
    copy.edit((document) => {
      document.setIn(['onStoreFailure'], 'open')
      document.setIn(['anonymous', 'perMinute'], 3)
    })
    expect(source.reload()).toBe(true)
    // The address spends its window (what earlier tests left of it counts), then the lookups it is
    // allowed past it: from then on a guess is refused without one.
    const status = async (response: Promise<Response>) => {
      const answered = await response
      await answered.arrayBuffer()
      return answered.status
    }
    const guess = () => request(generateApiKey())
    let sent = 0
    while ((await status(request())) !== 429) expect(++sent).toBeLessThanOrEqual(3)
    for (let misses = -1; misses !== cache.stats.misses; ) {
      misses = cache.stats.misses
      expect(await status(guess())).toBe(429)
      expect(++sent).toBeLessThan(10)
    }

    copy.edit((document) => document.setIn(['anonymous', 'perMinute'], 2))
    expect(source.reload()).toBe(true)
    const before = cache.stats.misses
    const refused = await guess()
    expect(expectRateLimitHeaders(refused, anonymous)).toMatchObject({ status: 429, limit: 2, remaining: 0 })
    await refused.arrayBuffer()
    expect(cache.stats.misses).toBe(before)
  })
})
