import { spawnSync } from 'node:child_process'
import { chmodSync, existsSync, readdirSync, statSync } from 'node:fs'
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, afterEach, describe, expect, it } from 'vitest'
import { removeEmbeddedTemplate, seedEmbeddedDatabase } from '../helpers/embeddedTemplate.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import {
  baseEnv,
  exitWithin,
  freePort,
  killAll,
  petBody,
  petsClient,
  runKeysCli,
  startNode,
  TOKEN,
  waitForPortClosed,
  waitForOutput,
  waitForReady,
  type NodeProcess,
} from './processes.ts'

// `npm start` on the embedded default: PGlite in the start process, the pets-service as its child.
// A cold PGlite start (initdb) takes several seconds, more on a busy machine.
const READY_MILLIS = 90_000
const STOP_MILLIS = 30_000

interface Stack {
  dataDir: string
  petsPort: number
  opsPort: number
  postgresPort: number
  gatewayPort: number
  gatewayOpsPort: number
}

const dataDirs: string[] = []
const database = suiteDatabase()

async function newStack(): Promise<Stack> {
  const parent = await mkdtemp(path.join(os.tmpdir(), 'aas-start-'))
  dataDirs.push(parent)
  // A folder npm start creates itself, as ./data on a first start.
  const dataDir = path.join(parent, 'data')
  // Every port chosen here, the gateway's too: a developer's own `npm start` on the defaults
  // must not fail the suite.
  return {
    dataDir,
    petsPort: await freePort(),
    opsPort: await freePort(),
    postgresPort: await freePort(),
    gatewayPort: await freePort(),
    gatewayOpsPort: await freePort(),
  }
}

/** A stack whose data folder holds the database a first start made (seedEmbeddedDatabase), for tests of what comes after. */
async function startedBeforeStack(): Promise<Stack> {
  const stack = await newStack()
  await seedEmbeddedDatabase(stack.dataDir)
  return stack
}

function stackEnv(stack: Stack): NodeJS.ProcessEnv {
  return {
    ...baseEnv(),
    DATA_DIR: stack.dataDir,
    PETS_PORT: String(stack.petsPort),
    PETS_OPS_PORT: String(stack.opsPort),
    EMBEDDED_POSTGRES_PORT: String(stack.postgresPort),
    GATEWAY_PORT: String(stack.gatewayPort),
    GATEWAY_OPS_PORT: String(stack.gatewayOpsPort),
    INTERNAL_TOKEN: TOKEN,
  }
}

/** `npm start` in its own process group, so a test can SIGKILL the whole tree like a crash. */
async function npmStart(stack: Stack, env: NodeJS.ProcessEnv = {}): Promise<NodeProcess> {
  const proc = startNode('scripts/start.ts', { ...stackEnv(stack), ...env }, { detached: true })
  // What the user waits for: the line saying what listens where.
  await waitForOutput(proc, '[start] ready:', READY_MILLIS)
  await waitForReady(`http://127.0.0.1:${stack.opsPort}/readyz`, proc, 5_000)
  return proc
}

/** The pid of the pets-service a running npm start names in its ready lines. */
function petsServicePid(start: NodeProcess): number {
  const pid = Number(/\[start\] {3}pets-service .* pid (\d+)$/m.exec(start.output())?.[1])
  expect(pid).toBeGreaterThan(0)
  return pid
}

async function sigterm(proc: NodeProcess) {
  process.kill(proc.pid, 'SIGTERM')
  const exit = await exitWithin(proc, STOP_MILLIS)
  // npm start's lines name what made a stop unclean: shown for whichever test did not expect it.
  if (exit.code !== 0) console.error(`npm start exited ${exit.code} on SIGTERM:\n${proc.output().slice(-4_000)}`)
  return exit
}

/** SIGTERM, and the clean stop's exit; a failure names npm start's error lines, as a CI log keeps only the end of a run. */
async function expectCleanStop(proc: NodeProcess): Promise<void> {
  const exit = await sigterm(proc)
  const errors = proc.output().split('\n').filter((line) => line.startsWith('[start] error'))
  expect(exit, errors.join('\n')).toEqual({ code: 0, signal: null })
}

/** A listener holding host:port, as another engineer's stack on the defaults does. */
function occupy(host: string, port: number): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    const server = net.createServer().once('error', reject)
    server.listen({ host, port, exclusive: true }, () => resolve(server))
  })
}

afterEach(killAll)
afterAll(async () => {
  await killAll()
  await removeEmbeddedTemplate()
  await Promise.all(dataDirs.map((dir) => rm(dir, { recursive: true, force: true })))
})

describe('npm start on the embedded default', () => {
  it(
    'names every taken port and the variable moving each in one message, leaving no data folder behind; the next start is a first start: ' +
      'it issues a demo key, serves the catalogue, stops cleanly on SIGTERM and keeps the pets across a restart',
    async () => {
      const stack = await newStack()
      const occupants = await Promise.all([occupy('127.0.0.1', stack.petsPort), occupy('0.0.0.0', stack.gatewayOpsPort)])
      try {
        const refused = startNode('scripts/start.ts', stackEnv(stack), { detached: true })
        expect((await exitWithin(refused, 30_000)).code).toBe(1)
        const output = refused.output()
        expect(output).toContain(
          `127.0.0.1:${stack.petsPort} (pets-service), 0.0.0.0:${stack.gatewayOpsPort} (gateway's ops port) are already in use. ` +
            'Is another npm start running? Otherwise set PETS_PORT, GATEWAY_OPS_PORT to free ports.',
        )
        expect(output).not.toContain('creating the embedded database')
        // Nothing half-made: no empty data folder for the user to wonder about.
        expect(existsSync(stack.dataDir)).toBe(false)
      } finally {
        await Promise.all(occupants.map((server) => new Promise((resolve) => server.close(resolve))))
      }

      const first = await npmStart(stack)
      await waitForOutput(first, '[start] try it:', 10_000)
      expect(first.output()).toContain('[start] first start: issued a Free-plan demo key')
      expect(first.output()).toContain('DATABASE_URL is not set')
      expect(first.output()).toContain(`http://127.0.0.1:${stack.petsPort}`)

      // Other commands find the running embedded database through this file.
      const record = JSON.parse(await readFile(path.join(stack.dataDir, 'embedded-postgres.json'), 'utf8'))
      // `started` tells this process from a later one given its pid (Linux: boot id and start time).
      expect(record).toEqual({
        url: `postgres:///postgres?host=${stack.dataDir}&port=${stack.postgresPort}&user=postgres&sslmode=disable`,
        pid: first.pid,
        started: expect.stringMatching(/^[0-9a-f-]+:\d+$/),
      })
      // The database and that file are for this user's eyes only.
      expect(statSync(stack.dataDir).mode & 0o777).toBe(0o700)

      const pets = petsClient(stack.petsPort)
      const created = await pets.create({ name: 'Rex', categoryId: 1 })
      expect(created.status).toBe(201)
      const rex = await petBody(created)
      expect(rex).toMatchObject({ name: 'Rex', categoryId: 1, status: 'available' })
      expect(await (await pets.list()).json()).toEqual([rex])

      await expectCleanStop(first)
      expect(first.output()).toContain('[start] stopped')
      expect(existsSync(path.join(stack.dataDir, 'embedded-postgres.json'))).toBe(false)
      await waitForPortClosed(stack.petsPort, 5_000)

      const second = await npmStart(stack)
      // No second demo key; the way to more keys names this data folder, where the CLI finds the database.
      await waitForOutput(second, `more keys: DATA_DIR=${stack.dataDir} npm run keys -- create`, 10_000)
      expect(await (await pets.list()).json()).toEqual([rex])
      await expectCleanStop(second)
    },
    4 * READY_MILLIS,
  )

  it(
    'a pet created before SIGKILL of the whole tree is there after restart; ' +
      'a service killed with SIGKILL is not restarted: npm start names it, stops the rest, closes the database and exits 1; ' +
      'a service that does not stop within 15 s of SIGTERM is killed: npm start names it, still closes the database, and exits 1; ' +
      'a second signal while npm start waits for it kills everything at once and exits 1, saying so',
    async () => {
      // The other cases run while one waits out its 15 s.
      const crashed = async () => {
        const stack = await startedBeforeStack()
        const first = await npmStart(stack)
        const pets = petsClient(stack.petsPort)
        const created = await pets.create({ name: 'Rex', categoryId: 1 })
        expect(created.status).toBe(201)
        const rex = await petBody(created)

        // The whole tree dies at once (power cut, OOM killer): no shutdown step runs.
        first.kill()
        expect(await first.exited).toEqual({ code: null, signal: 'SIGKILL' })
        // The pets-service runs in its own process group and must not outlive npm start.
        await waitForPortClosed(stack.petsPort, 10_000)
        await waitForPortClosed(stack.opsPort, 10_000)

        // The stale embedded-postgres.json and PGlite's files are recovered on the next start.
        const second = await npmStart(stack)
        expect(second.output()).toContain('did not stop cleanly')
        const fetched = await pets.get(rex.id)
        expect(fetched.status).toBe(200)
        expect(await fetched.json()).toEqual(rex)
        await expectCleanStop(second)
      }
      const killed = async () => {
        const stack = await startedBeforeStack()
        const first = await npmStart(stack)
        const gatewayPid = Number(/\[start\] {3}gateway .* pid (\d+)$/m.exec(first.output())?.[1])
        expect(gatewayPid).toBeGreaterThan(0)
        process.kill(gatewayPid, 'SIGKILL')

        expect(await exitWithin(first, STOP_MILLIS)).toEqual({ code: 1, signal: null })
        expect(first.output()).toContain('[start] error: gateway exited unexpectedly (signal SIGKILL); stopping everything')
        await waitForPortClosed(stack.petsPort, 5_000)
        // The database was closed and the folder given back: the next start is no recovery.
        expect(existsSync(path.join(stack.dataDir, 'embedded-postgres.json'))).toBe(false)
        const second = await npmStart(stack)
        expect(second.output()).not.toContain('did not stop cleanly')
        await expectCleanStop(second)
      }
      const outwaited = async () => {
        const stack = await startedBeforeStack()
        const first = await npmStart(stack)
        const petsPid = petsServicePid(first)
        // Stopped, it cannot act on SIGTERM, as a service stuck in a busy loop cannot.
        process.kill(petsPid, 'SIGSTOP')

        expect(await sigterm(first)).toEqual({ code: 1, signal: null })
        expect(first.output()).toContain('[start] error: pets-service did not stop within 15 s and was killed')
        expect(first.output()).not.toContain('[start] stopped')
        await waitForPortClosed(stack.petsPort, 5_000)
        // The database was still closed and the folder given back: the next start is no recovery.
        expect(existsSync(path.join(stack.dataDir, 'embedded-postgres.json'))).toBe(false)
      }
      const signalledTwice = async () => {
        const stack = await startedBeforeStack()
        const first = await npmStart(stack)
        const petsPid = petsServicePid(first)
        process.kill(petsPid, 'SIGSTOP')
        process.kill(first.pid, 'SIGTERM')
        await waitForOutput(first, '[start] SIGTERM: stopping', 10_000)
        // The gateway stops first; then npm start waits on the stopped pets-service, up to 15 s.
        await waitForPortClosed(stack.gatewayPort, 10_000)
        process.kill(first.pid, 'SIGTERM')
        expect(await exitWithin(first, 5_000)).toEqual({ code: 1, signal: null })
        expect(first.output()).toContain('[start] warning: SIGTERM again: killing everything now')
        // A stopped process keeps its port (the kernel still accepts on it): closed, it was killed.
        await waitForPortClosed(stack.petsPort, 5_000)
      }
      // Two stacks at most at once, for a machine of two cores.
      await Promise.all([outwaited(), (async () => {
        await crashed()
        await killed()
        await signalledTwice()
      })()])
    },
    4 * READY_MILLIS,
  )

  it(
    'npm start killed during its very first start, on an existing empty folder as DATA_DIR, comes up next time, the folder made private to its user; ' +
      'a second npm start refuses the data folder of one that is stopped (Ctrl-Z) before it serves, however long it stays stopped',
    async () => {
      const stack = await newStack()
      await mkdir(stack.dataDir, { mode: 0o755 })
      const killed = startNode('scripts/start.ts', stackEnv(stack), { detached: true })
      await waitForOutput(killed, 'creating the embedded database', READY_MILLIS)
      await new Promise((resolve) => setTimeout(resolve, 1_500))
      killed.kill()
      await killed.exited

      // The next start: it is stopped once it owns the folder, well before it serves.
      const first = startNode('scripts/start.ts', stackEnv(stack), { detached: true })
      const claim = path.join(stack.dataDir, 'embedded-postgres.json')
      const claimant = async () => JSON.parse(await readFile(claim, 'utf8')).pid as number
      while ((await claimant().catch(() => undefined)) !== first.pid) {
        if (first.hasExited()) throw new Error(`the next npm start exited:\n${first.output()}`)
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
      process.kill(first.pid, 'SIGSTOP')
      try {
        const other: Stack = { ...stack, petsPort: await freePort(), opsPort: await freePort(), postgresPort: await freePort() }
        // Waiting past the 15 s a start may take used to hand the folder, and its files, to the second.
        const second = startNode('scripts/start.ts', stackEnv(other), { detached: true })
        expect(await exitWithin(second, STOP_MILLIS)).toEqual({ code: 1, signal: null })
        expect(second.output()).toMatch(/another npm start \(pid \d+\) (owns .* and is still starting, or is stopped|is already running)/)
        expect(await claimant()).toBe(first.pid)
      } finally {
        process.kill(first.pid, 'SIGCONT')
      }
      await waitForOutput(first, '[start] ready:', READY_MILLIS)
      await waitForReady(`http://127.0.0.1:${stack.opsPort}/readyz`, first, 5_000)
      const created = await petsClient(stack.petsPort).create({ name: 'Rex', categoryId: 1 })
      expect(created.status).toBe(201)
      expect(statSync(stack.dataDir).mode & 0o777).toBe(0o700)
      expect(existsSync(path.join(stack.dataDir, 'pglite', 'PG_VERSION'))).toBe(true)
      await expectCleanStop(first)
    },
    4 * READY_MILLIS,
  )

  it('refuses a DATA_DIR that holds other files (a home or project folder) in one line naming it, leaving its mode and files as they were', async () => {
    const stack = await newStack()
    await mkdir(path.join(stack.dataDir, 'src'), { recursive: true })
    await writeFile(path.join(stack.dataDir, 'notes.txt'), 'mine')
    await writeFile(path.join(stack.dataDir, 'src', 'main.c'), 'int main;')
    chmodSync(stack.dataDir, 0o755)
    const proc = startNode('scripts/start.ts', stackEnv(stack), { detached: true })
    expect(await exitWithin(proc, 30_000)).toEqual({ code: 1, signal: null })
    expect(proc.output()).toContain(
      `[start] error: DATA_DIR ${stack.dataDir} holds other files and no embedded database of npm start (no pglite/PG_VERSION); ` +
        'npm start left it untouched: set DATA_DIR to an empty or new folder\n',
    )
    expect(proc.output()).not.toContain('creating the embedded database')
    expect(statSync(stack.dataDir).mode & 0o777).toBe(0o755)
    expect(readdirSync(stack.dataDir, { recursive: true }).sort()).toEqual(['notes.txt', 'src', path.join('src', 'main.c')])
  })

  it(
    'serves the embedded Postgres on a Unix socket in the private data folder, not on a TCP port: other users cannot connect, the CLI and both services can; ' +
      'a second npm start on the same data folder refuses to run and leaves the first one serving',
    async () => {
      const stack = await startedBeforeStack()
      // Open to others, as a project folder usually is: only the data folder itself keeps them out.
      chmodSync(path.dirname(stack.dataDir), 0o755)
      // Something else on the TCP port of the same number no longer matters.
      const squatter = net.createServer()
      await new Promise<void>((resolve) => squatter.listen({ host: '127.0.0.1', port: stack.postgresPort }, resolve))
      let proc: NodeProcess
      try {
        proc = await npmStart(stack, { DATABASE_POOL_SIZE: '20' })
      } finally {
        await new Promise((resolve) => squatter.close(resolve))
      }
      // The demo key is issued once the services are ready.
      await waitForOutput(proc, '[start] try it:', 10_000)
      await waitForPortClosed(stack.postgresPort, 1_000)
      const socket = path.join(stack.dataDir, `.s.PGSQL.${stack.postgresPort}`)
      expect(statSync(socket).isSocket()).toBe(true)
      expect(statSync(stack.dataDir).mode & 0o777).toBe(0o700)
      expect(proc.output()).toContain(`psql -h ${stack.dataDir} -p ${stack.postgresPort} -U postgres`)

      // libpq's and pg's way to a socket: the directory as the host, and the port.
      const client = new pg.Client({ host: stack.dataDir, port: stack.postgresPort, user: 'postgres', database: 'postgres' })
      await client.connect()
      try {
        const { rows } = await client.query<{ count: number }>('SELECT count(*)::int AS count FROM gateway.api_keys')
        expect(rows).toEqual([{ count: 1 }])
      } finally {
        await client.end()
      }
      // Both services may fill pools of DATABASE_POOL_SIZE (20 here) beside the CLI: the server takes
      // them all, past its default of 32 connections.
      const pools = Array.from({ length: 40 }, () => new pg.Client({ host: stack.dataDir, port: stack.postgresPort, user: 'postgres', database: 'postgres' }))
      try {
        const answered = await Promise.all(pools.map(async (pooled) => (await pooled.connect(), (await pooled.query('SELECT 1 AS one')).rows[0].one)))
        expect(answered).toEqual(Array(40).fill(1))
      } finally {
        await Promise.all(pools.map((pooled) => pooled.end().catch(() => undefined)))
      }

      if (process.getuid?.() === 0) {
        // Another account of the machine (nobody), trying the socket it would find by the same name.
        const tryConnect = `require('net').connect(${JSON.stringify(socket)}).on('connect', () => { console.log('connected'); process.exit(0) }).on('error', (e) => { console.log(e.code); process.exit(0) })`
        const other = spawnSync(process.execPath, ['-e', tryConnect], { uid: 65534, gid: 65534, cwd: '/', encoding: 'utf8', timeout: 10_000 })
        expect(other.stdout.trim()).toBe('EACCES')
      }

      // The keys CLI finds the database through the discovery file; the gateway takes the demo key.
      const listed = await runKeysCli(['list', '--json'], { ...baseEnv(), DATA_DIR: stack.dataDir }, 20_000)
      expect(listed.code, listed.stderr).toBe(0)
      expect(JSON.parse(listed.stdout)).toMatchObject({ keys: [{ name: 'demo', plan: 'free' }] })
      const demoKey = /aas_[0-9A-Za-z]{38}/.exec(proc.output())?.[0]
      const answer = await fetch(`http://127.0.0.1:${stack.gatewayPort}/v1/pets`, { headers: { authorization: `Bearer ${demoKey}` } })
      expect(answer.status).toBe(200)

      const other: Stack = { ...stack, petsPort: await freePort(), opsPort: await freePort(), postgresPort: await freePort() }
      const second = startNode('scripts/start.ts', stackEnv(other), { detached: true })
      expect(await exitWithin(second, STOP_MILLIS)).toEqual({ code: 1, signal: null })
      expect(second.output()).toMatch(/another npm start \(pid \d+\) is already running/)
      const ready = await fetch(`http://127.0.0.1:${stack.opsPort}/readyz`)
      expect(ready.status).toBe(200)
      const record = JSON.parse(await readFile(path.join(stack.dataDir, 'embedded-postgres.json'), 'utf8'))
      expect(record.pid).toBe(proc.pid)

      await expectCleanStop(proc)
      expect(existsSync(socket)).toBe(false)
    },
    2 * READY_MILLIS,
  )
})

describe('npm start where its ports are taken', () => {
  // npm start asked each ops port for /readyz with fetch, which refuses the ports browsers block:
  // a stack whose ops port was one of them never became ready.
  it(
    'on a real database (DATABASE_URL), its ops ports on ports fetch refuses to call (6666, 6667), becomes ready, issues no demo key, ' +
      'and says how to make one; a key made so is served',
    async () => {
      const free = await newStack()
      const taken = await Promise.all([6666, 6667].map((port) => new Promise<boolean>((resolve) => {
        const probe = net.connect(port, '127.0.0.1')
        probe.once('connect', () => (probe.destroy(), resolve(true)))
        probe.once('error', () => resolve(false))
      })))
      if (taken.some(Boolean)) console.warn('6666 or 6667 is taken here: ops ports on ports fetch refuses not checked')
      const stack = taken.some(Boolean) ? free : { ...free, opsPort: 6666, gatewayOpsPort: 6667 }
      // Not npmStart: its own readiness wait is a fetch too. The ready line comes once both ops
      // ports answered npm start's /readyz with 200.
      // A config of its own with a plan config/gateway.yaml lacks: the CLI must be told of it too.
      const config = path.join(path.dirname(stack.dataDir), 'gateway.yaml')
      await writeFile(config, (await readFile('config/gateway.yaml', 'utf8')).replace('plans:\n', 'plans:\n  gold:       { perMinute: 2000, perDay: 50000 }\n'))
      const proc = startNode('scripts/start.ts', { ...stackEnv(stack), DATABASE_URL: database.url, GATEWAY_CONFIG: config }, { detached: true })
      await waitForOutput(proc, '[start] ready:', READY_MILLIS)
      await waitForOutput(proc, '[start] keys:', 10_000)
      const output = proc.output()
      expect(output).not.toContain('first start')
      expect(output).toContain(`[start] keys: GATEWAY_CONFIG=${config} npm run keys -- create --plan free --name my-app   (with this DATABASE_URL; the name says who the key is for)`)
      const created = await runKeysCli(['create', '--plan', 'gold', '--name', 'walkthrough', '--json'], { ...baseEnv(), DATABASE_URL: database.url, GATEWAY_CONFIG: config })
      expect(created.code, created.stderr).toBe(0)
      const { key } = JSON.parse(created.stdout) as { key: string }
      const answer = await fetch(`http://127.0.0.1:${stack.gatewayPort}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
      expect(answer.status).toBe(200)
      expect(answer.headers.get('x-ratelimit-limit')).toBe('2000')
      expect(await sigterm(proc)).toMatchObject({ code: 0 })
    },
    READY_MILLIS + STOP_MILLIS,
  )

  it('refuses a gateway config the gateway would refuse, naming its line, before creating a database or starting a service', async () => {
    const stack = await newStack()
    const config = path.join(path.dirname(stack.dataDir), 'gateway.yaml')
    await writeFile(config, (await readFile('config/gateway.yaml', 'utf8')).replace('onStoreFailure: open', 'onStoreFailure: ajar'))
    const proc = startNode('scripts/start.ts', { ...stackEnv(stack), GATEWAY_CONFIG: config }, { detached: true })
    expect((await exitWithin(proc, 30_000)).code).toBe(1)
    const output = proc.output()
    expect(output).toMatch(/\[start\] error: invalid gateway config:\n\s+\S+gateway\.yaml:\d+: onStoreFailure must be/)
    expect(output).not.toContain('creating the embedded database')
    expect(output).not.toContain('pets-service')
  })

  // The gateway's variables were checked before anything started; these reached the pets-service
  // only, after the embedded database was created, or (PETS_HOST) came back as getaddrinfo's words.
  it.each([
    ['PETS_HOST', 'a b', 'PETS_HOST must be an IP address or a host name (got "a b")'],
    ['LOG_LEVEL', 'verbose', 'LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent (got "verbose")'],
    ['PETS_MAX_CONNECTIONS', '0', 'PETS_MAX_CONNECTIONS must be a whole number of connections from 1 to 1000000, got "0"'],
    ['INTERNAL_TOKEN', 'short', 'INTERNAL_TOKEN must be at least 16 characters'],
    ['SHUTDOWN_DRAIN_SECONDS', '61', 'SHUTDOWN_DRAIN_SECONDS must be a number of seconds from 0 to 60, got "61"'],
  ])('refuses %s=%s naming it, before creating a database or starting a service', async (variable, value, problem) => {
    const stack = await newStack()
    const proc = startNode('scripts/start.ts', { ...stackEnv(stack), [variable]: value }, { detached: true })
    expect((await exitWithin(proc, 30_000)).code).toBe(1)
    const output = proc.output()
    expect(output).toContain(`[start] error: ${problem}`)
    expect(output).not.toContain('creating the embedded database')
    expect(output).not.toContain('pets-service cannot start')
    expect(existsSync(stack.dataDir)).toBe(false)
  })

  // Free before the start, but two of its own listeners on one: the gateway died on EADDRINUSE
  // with a stack trace, after the database had been created and the pets-service started.
  it('refuses two of its own listeners on one port, naming both variables, before creating a database or starting a service', async () => {
    const stack = await newStack()
    const proc = startNode('scripts/start.ts', { ...stackEnv(stack), GATEWAY_PORT: String(stack.petsPort) }, { detached: true })
    expect((await exitWithin(proc, 30_000)).code).toBe(1)
    const output = proc.output()
    expect(output).toContain(
      `[start] error: PETS_PORT and GATEWAY_PORT are both ${stack.petsPort} on one address (127.0.0.1 and 0.0.0.0): ` +
        'set one of them to another port',
    )
    expect(output).not.toContain('creating the embedded database')
    expect(output).not.toMatch(/\n\s+at /)
    expect(existsSync(stack.dataDir)).toBe(false)
  })
})
