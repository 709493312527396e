import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, afterEach, describe, expect, it } from 'vitest'
import { removeEmbeddedTemplate, seedEmbeddedDatabase } from '../helpers/embeddedTemplate.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import {
  baseEnv,
  freePort,
  killAll,
  startProcess,
  TOKEN,
  waitForOutput,
  waitForPortClosed,
  waitForReady,
  type NodeProcess,
} from './processes.ts'

// The real `npm start` (npm → sh → node scripts/start.ts → the services), and a signal sent to
// the npm process alone, as `kill <pid>` does: npm passes SIGTERM on to sh only and SIGHUP to
// nobody, so the rest of the chain must notice that npm is gone. Linux: the process tree is read
// from /proc.
const READY_MILLIS = 90_000
/** From the signal to every port closed and every process gone: a 500 ms poll plus an ordinary shutdown. */
const STOPPED_MILLIS = 15_000

const dataDirs: string[] = []
/** Every process a test saw below npm: killAll reaches npm's process group only, not the services'. */
const seen = new Map<number, string>()

function killSeen(): void {
  for (const [pid, command] of seen) {
    try {
      // The same process still (same command line), not another that got its pid since.
      if (running(pid) && processInfo(pid)?.command === command) process.kill(pid, 'SIGKILL')
    } catch {
      // Already gone.
    }
  }
  seen.clear()
}

afterEach(async () => {
  await killAll()
  killSeen()
})
afterAll(async () => {
  await killAll()
  killSeen()
  await removeEmbeddedTemplate()
  await Promise.all(dataDirs.map((dir) => rm(dir, { recursive: true, force: true })))
})

interface Ports {
  gateway: number
  gatewayOps: number
  pets: number
  petsOps: number
  postgres: number
}

async function freePorts(): Promise<Ports> {
  return {
    gateway: await freePort(),
    gatewayOps: await freePort(),
    pets: await freePort(),
    petsOps: await freePort(),
    postgres: await freePort(),
  }
}

/** `npm start` as a user runs it, on free loopback ports, in its own process group (for killAll). */
async function npmStart(dataDir: string, ports: Ports): Promise<NodeProcess> {
  const proc = startProcess(
    'npm',
    ['start'],
    {
      ...baseEnv(),
      // The services' "stopped" lines show the order of the shutdown.
      LOG_LEVEL: 'info',
      DATA_DIR: dataDir,
      INTERNAL_TOKEN: TOKEN,
      GATEWAY_HOST: '127.0.0.1',
      GATEWAY_PORT: String(ports.gateway),
      GATEWAY_OPS_HOST: '127.0.0.1',
      GATEWAY_OPS_PORT: String(ports.gatewayOps),
      PETS_PORT: String(ports.pets),
      PETS_OPS_PORT: String(ports.petsOps),
      EMBEDDED_POSTGRES_PORT: String(ports.postgres),
    },
    { detached: true },
  )
  await waitForOutput(proc, '[start] Ctrl-C stops everything', READY_MILLIS)
  await waitForReady(`http://127.0.0.1:${ports.gatewayOps}/readyz`, proc, 5_000)
  for (const info of descendants(proc.pid)) seen.set(info.pid, info.command)
  return proc
}

/** A data folder holding the database a first start made (removed after the file), free ports, and `npm start` on them. */
async function startStack(): Promise<{ dataDir: string; ports: Ports; npm: NodeProcess }> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), 'aas-npm-start-'))
  dataDirs.push(dataDir)
  await seedEmbeddedDatabase(dataDir)
  const ports = await freePorts()
  return { dataDir, ports, npm: await npmStart(dataDir, ports) }
}

interface ProcessInfo {
  pid: number
  parent: number
  state: string
  command: string
}

function processInfo(pid: number): ProcessInfo | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim()
    return { pid, parent: Number(fields[1]), state: fields[0]!, command }
  } catch {
    return undefined
  }
}

/** Every process below `root`, read from /proc. */
function descendants(root: number): ProcessInfo[] {
  const all = readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map((name) => processInfo(Number(name)))
    .filter((info) => info !== undefined)
  const found: ProcessInfo[] = []
  let parents = new Set([root])
  while (parents.size > 0) {
    const children = all.filter((info) => parents.has(info.parent))
    found.push(...children)
    parents = new Set(children.map((info) => info.pid))
  }
  return found
}

/** Still running: present and not a zombie (an exited process nobody has collected yet). */
function running(pid: number): boolean {
  const info = processInfo(pid)
  return info !== undefined && info.state !== 'Z'
}

async function allGone(pids: number[], timeoutMillis: number): Promise<void> {
  const deadline = Date.now() + timeoutMillis
  while (pids.some(running)) {
    if (Date.now() > deadline) {
      const left = pids.filter(running).map((pid) => processInfo(pid)?.command)
      throw new Error(`still running ${timeoutMillis} ms after the signal: ${left.join('; ')}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

/** The position of a service's "stopped" log line in the output. */
function stoppedAt(output: string, service: string): number {
  return output.search(new RegExp(`"service":"${service}"[^\\n]*"msg":"stopped"`))
}

/** The order Ctrl-C stops the stack in (gateway, pets-service, then the database), its claim and its socket gone. */
function expectStoppedInOrder(output: string, dataDir: string, ports: Ports): void {
  expect(stoppedAt(output, 'pets-service')).toBeGreaterThan(stoppedAt(output, 'gateway'))
  expect(output.indexOf('[start] stopped')).toBeGreaterThan(stoppedAt(output, 'pets-service'))
  expect(existsSync(path.join(dataDir, 'embedded-postgres.json'))).toBe(false)
  expect(existsSync(path.join(dataDir, `.s.PGSQL.${ports.postgres}`))).toBe(false)
}

describe.skipIf(process.platform !== 'linux')('npm start, signalled through the npm process only', () => {
  /** Sends `signal` to npm alone; every port closes, every process below npm ends, in Ctrl-C's order. */
  async function expectStoppedBy(signal: 'SIGTERM' | 'SIGHUP', { dataDir, ports, npm }: { dataDir: string; ports: Ports; npm: NodeProcess }) {
    const tree = descendants(npm.pid)
    const commands = tree.map((info) => info.command)
    expect(commands.some((command) => command.includes('scripts/start.ts'))).toBe(true)
    expect(commands.some((command) => command.includes('gateway/src/main.ts'))).toBe(true)
    expect(commands.some((command) => command.includes('pets-service/src/main.ts'))).toBe(true)
    // The ready output names the gateway's pid, for a config reload by SIGHUP.
    const gatewayPid = Number(/kill -HUP (\d+)/.exec(npm.output())?.[1])
    expect(commands[tree.findIndex((info) => info.pid === gatewayPid)]).toContain('gateway/src/main.ts')

    const signalledAt = Date.now()
    process.kill(npm.pid, signal)
    for (const port of Object.values(ports)) await waitForPortClosed(port, STOPPED_MILLIS)
    await allGone(
      tree.map((info) => info.pid),
      Math.max(1_000, STOPPED_MILLIS - (Date.now() - signalledAt)),
    )

    // The same orderly stop as Ctrl-C: the gateway, then the pets-service, then the database.
    const output = npm.output()
    expect(output).toMatch(/\[start\] npm \(pid \d+\) exited: stopping/)
    expect(stoppedAt(output, 'gateway')).toBeGreaterThan(0)
    expectStoppedInOrder(output, dataDir, ports)
  }

  // One stack for both SIGHUPs: the one to the gateway must leave it running, the one to npm must not.
  it(
    'SIGHUP to the gateway pid that npm start prints reloads the config and leaves the stack running; ' +
      'SIGHUP to npm then stops the whole stack in order: every port released, no process left',
    async () => {
      const stack = await startStack()
      const { ports, npm } = stack
      const gatewayPid = Number(/kill -HUP (\d+)/.exec(npm.output())?.[1])

      process.kill(gatewayPid, 'SIGHUP')
      await waitForOutput(npm, 'gateway config reloaded', 5_000)
      const ready = await fetch(`http://127.0.0.1:${ports.gatewayOps}/readyz`)
      expect(ready.status).toBe(200)
      expect(running(gatewayPid)).toBe(true)
      expect(npm.output()).not.toContain('[start] SIGHUP')

      await expectStoppedBy('SIGHUP', stack)
    },
    2 * READY_MILLIS,
  )

  // Regression (the Ctrl-C): under tsx's CLI, a Ctrl-C that found the embedded Postgres busy was
  // answered with SIGKILL 60 ms later (tsx's signal relay), leaving the database's claim behind.
  it(
    'SIGTERM to npm stops the whole stack in order: every port released, no process left; ' +
      'Ctrl-C while the embedded Postgres runs a long statement stops the stack in order',
    async () => {
      // Two stacks side by side: each stop is mostly waiting.
      const ctrlC = async () => {
        const { dataDir, ports, npm } = await startStack()
        const tree = descendants(npm.pid)

        const client = new pg.Client({ host: dataDir, port: ports.postgres, user: 'postgres', database: 'postgres' })
        await client.connect()
        client.on('error', () => undefined)
        const longStatement = client.query('SELECT count(*) FROM generate_series(1, 3000000)').catch(() => undefined)
        await new Promise((resolve) => setTimeout(resolve, 300))
        // What a terminal's Ctrl-C does: SIGINT to every process of the foreground group.
        process.kill(-npm.pid, 'SIGINT')
        for (const port of Object.values(ports)) await waitForPortClosed(port, STOPPED_MILLIS)
        await allGone(
          tree.map((info) => info.pid),
          STOPPED_MILLIS,
        )
        await longStatement
        await client.end().catch(() => undefined)

        const output = npm.output()
        expect(output).toContain('[start] SIGINT: stopping')
        expectStoppedInOrder(output, dataDir, ports)
      }
      await Promise.all([(async () => expectStoppedBy('SIGTERM', await startStack()))(), ctrlC()])
    },
    2 * READY_MILLIS,
  )
})

describe.skipIf(process.platform !== 'linux')('npm run start:gateway and start:pets, signalled through the npm process only', () => {
  const database = suiteDatabase()

  /** Both services' environment on free loopback ports, against `databaseUrl`; info lines name a stop's cause. */
  async function servicesEnv(databaseUrl: string) {
    const [pets, petsOps, gateway, gatewayOps] = [await freePort(), await freePort(), await freePort(), await freePort()]
    const env: NodeJS.ProcessEnv = {
      ...baseEnv(),
      LOG_LEVEL: 'info',
      REDIS_URL: '',
      DATABASE_URL: databaseUrl,
      INTERNAL_TOKEN: TOKEN,
      PETS_PORT: String(pets),
      PETS_OPS_PORT: String(petsOps),
      PETS_URL: `http://127.0.0.1:${pets}`,
      GATEWAY_HOST: '127.0.0.1',
      GATEWAY_PORT: String(gateway),
      GATEWAY_OPS_HOST: '127.0.0.1',
      GATEWAY_OPS_PORT: String(gatewayOps),
    }
    return { env, pets, petsOps, gateway, gatewayOps }
  }

  // Regression: npm passed SIGTERM to sh alone, and the service (under tsx) kept listening,
  // orphaned, with /readyz still 200: a supervisor stopping `npm run start:gateway` leaked it.
  it('SIGTERM and SIGHUP to npm each stop the service it runs: its ports released, no process left', async () => {
    // One pair of services per signal, side by side: each stop is mostly waiting.
    await Promise.all(
      (['SIGTERM', 'SIGHUP'] as const).map(async (signal) => {
        const { env, pets, petsOps, gateway, gatewayOps } = await servicesEnv(database.url)
        const started = [
          { proc: startProcess('npm', ['run', 'start:pets'], env, { detached: true }), ports: [pets, petsOps] },
          { proc: startProcess('npm', ['run', 'start:gateway'], env, { detached: true }), ports: [gateway, gatewayOps] },
        ]
        await waitForReady(`http://127.0.0.1:${petsOps}/readyz`, started[0]!.proc, READY_MILLIS)
        await waitForReady(`http://127.0.0.1:${gatewayOps}/readyz`, started[1]!.proc, READY_MILLIS)

        // Each service on its own: both signalled at once.
        await Promise.all(
          started.map(async ({ proc, ports }) => {
            const tree = descendants(proc.pid)
            for (const info of tree) seen.set(info.pid, info.command)
            const signalledAt = Date.now()
            process.kill(proc.pid, signal)
            for (const port of ports) await waitForPortClosed(port, STOPPED_MILLIS)
            await allGone(
              tree.map((info) => info.pid),
              Math.max(1_000, STOPPED_MILLIS - (Date.now() - signalledAt)),
            )
            expect(proc.output()).toMatch(/"launcher":"npm \(pid \d+\) exited"[^\n]*"msg":"shutting down"/)
          }),
        )
      }),
    )
  }, 2 * READY_MILLIS)

  // A service may wait long for Postgres at start: npm going away meanwhile must end it too, or it
  // would start serving, orphaned, once Postgres appeared.
  it('SIGTERM to npm while start:gateway, or start:pets, waits for Postgres ends the service, no process left', async () => {
    await Promise.all(
      (['start:gateway', 'start:pets'] as const).map(async (script) => {
        const nobodyListens = new URL(database.url)
        nobodyListens.host = `127.0.0.1:${await freePort()}`
        const { env, petsOps, gatewayOps } = await servicesEnv(nobodyListens.toString())
        const proc = startProcess('npm', ['run', script], env, { detached: true })
        await waitForOutput(proc, 'waiting for Postgres at DATABASE_URL', READY_MILLIS)
        const tree = descendants(proc.pid)
        for (const info of tree) seen.set(info.pid, info.command)
        process.kill(proc.pid, 'SIGTERM')
        await allGone(
          tree.map((info) => info.pid),
          STOPPED_MILLIS,
        )
        await waitForPortClosed(script === 'start:gateway' ? gatewayOps : petsOps, 1_000)
        expect(proc.output()).toMatch(/"launcher":"npm \(pid \d+\) exited"[^\n]*"msg":"launcher gone while starting, exiting"/)
      }),
    )
  }, 2 * READY_MILLIS)
})
