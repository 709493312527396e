import { spawnSync } from 'node:child_process'
import { statfsSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, afterEach, expect, it } from 'vitest'
import { socketUrl } from '../../common/src/database/embeddedPostgres.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { baseEnv, exitWithin, freePort, killAll, startNode, TOKEN, waitForOutput, waitForReady, type NodeProcess } from './processes.ts'

// `npm start`'s embedded database on a disk that fills up, or that it cannot write: file systems of
// its own (tmpfs, which only root may mount; elsewhere the tests are skipped and say so).
const READY_MILLIS = 90_000
const MIB = 2 ** 20

const root = await mkdtemp(path.join(os.tmpdir(), 'aas-disk-full-'))
const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=48m', 'tmpfs', root]).status === 0
const dataDir = path.join(root, 'data')
const readOnly = await mkdtemp(path.join(os.tmpdir(), 'aas-read-only-'))
const mountedReadOnly = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m,ro', 'tmpfs', readOnly]).status === 0

afterEach(killAll)
afterAll(async () => {
  for (const [folder, done] of [[root, mounted], [readOnly, mountedReadOnly]] as const) {
    if (done) spawnSync('umount', ['-l', folder])
    await rm(folder, { recursive: true, force: true })
  }
})

function freeBytes(): number {
  const { bavail, bsize } = statfsSync(root)
  return bavail * bsize
}

async function npmStart(ports: { pets: number; petsOps: number; gateway: number; gatewayOps: number; postgres: number }, data = dataDir): Promise<NodeProcess> {
  return startNode('scripts/start.ts', {
    ...baseEnv(),
    DATA_DIR: data,
    PETS_PORT: String(ports.pets),
    PETS_OPS_PORT: String(ports.petsOps),
    GATEWAY_PORT: String(ports.gateway),
    GATEWAY_OPS_PORT: String(ports.gatewayOps),
    EMBEDDED_POSTGRES_PORT: String(ports.postgres),
    INTERNAL_TOKEN: TOKEN,
  })
}

it.skipIf(!mounted)(
  'a full disk under the embedded database: npm start stops with the reason, and the next start recovers every commit',
  async () => {
    const ports = { pets: await freePort(), petsOps: await freePort(), gateway: await freePort(), gatewayOps: await freePort(), postgres: await freePort() }
    const first = await npmStart(ports)
    await waitForOutput(first, '[start] ready:', READY_MILLIS)
    await waitForReady(`http://127.0.0.1:${ports.petsOps}/readyz`, first, 5_000)

    // Rows updated one transaction at a time: each commit is on disk before the next, and the
    // write-ahead log grows until it needs a new 16 MB file the disk has no room for.
    const client = new pg.Client({ connectionString: socketUrl(dataDir, ports.postgres) })
    await client.connect()
    await client.query('CREATE TABLE ledger (id int PRIMARY KEY, commits int NOT NULL, pad text)')
    await client.query("INSERT INTO ledger SELECT g, 0, '' FROM generate_series(1, 100) g")
    await writeFile(path.join(root, 'everything-else'), Buffer.alloc(freeBytes() - MIB))
    let committed = 0
    let failure: Error | undefined
    client.on('error', () => undefined)
    while (!failure) {
      try {
        await client.query(`UPDATE ledger SET commits = commits + 1, pad = repeat(md5($1), 16) WHERE id = $2`, [String(committed), (committed % 100) + 1])
        committed += 1
      } catch (error) {
        failure = error as Error
      }
    }
    await client.end().catch(() => undefined)
    expect(failure.message).toMatch(/No space left on device|Connection terminated/)

    // Before: PGlite, panicked, spun on npm start's only thread: 503s for ever, and Ctrl-C did nothing.
    const panicSeenAt = performance.now()
    const exit = await exitWithin(first, 30_000)
    const stoppedWithin = (performance.now() - panicSeenAt) / 1000
    expect(exit.code).toBe(1)
    expect(first.output()).toMatch(/\[start\] error: the embedded database stopped: PANIC: .*No space left on device\. Free some space on that disk/)

    // Its log is still full: npm start says that is why it cannot open the database.
    const refused = await npmStart(ports)
    expect((await exitWithin(refused, 60_000)).code).toBe(1)
    expect(refused.output()).toMatch(/cannot open the embedded database in .*: .*; the disk holding it has \d+\.\d MB free\. Free some space/)

    expect(spawnSync('mount', ['-o', 'remount,size=96m', root]).status).toBe(0)
    const second = await npmStart(ports)
    await waitForOutput(second, '[start] ready:', READY_MILLIS)
    const after = new pg.Client({ connectionString: socketUrl(dataDir, ports.postgres) })
    await after.connect()
    const { rows } = await after.query<{ total: number }>('SELECT sum(commits)::int AS total FROM ledger')
    await after.end()
    expect(rows[0]!.total).toBe(committed)
    process.kill(second.pid, 'SIGTERM')
    expect(await exitWithin(second, 30_000)).toEqual({ code: 0, signal: null })

    recordScenario({
      area: 'Postgres',
      scenario: "The embedded database's disk fills up under npm start (its write-ahead log cannot grow)",
      answered: `npm start stopped everything with exit 1 ${stoppedWithin.toFixed(1)} s after the PANIC, saying the disk is full; a start on the still-full disk refused, saying how much is free`,
      lost: `nothing committed: ${committed} commits before the PANIC, all ${committed} there after the next start with room`,
      test: 'test/scripts/embeddedDiskFull.int.test.ts',
    })
  },
  240_000,
)

it.skipIf(!mountedReadOnly)('a DATA_DIR on a read-only file system: npm start says so, not "no such file or directory"', async () => {
  const ports = { pets: await freePort(), petsOps: await freePort(), gateway: await freePort(), gatewayOps: await freePort(), postgres: await freePort() }
  const start = await npmStart(ports, path.join(readOnly, 'new', 'data'))
  expect((await exitWithin(start, 30_000)).code).toBe(1)
  expect(start.output()).toContain(`[start] error: cannot make DATA_DIR ${path.join(readOnly, 'new', 'data')}: read-only file system (EROFS); set DATA_DIR to a folder npm start can write`)
})
