import { spawn, type ChildProcess } from 'node:child_process'
import path from 'node:path'
import { readFileSync } from 'node:fs'
import { request } from 'undici'
import { listenHostFromEnv, portFromEnv } from '../../common/src/env.ts'
import { DEFAULT_CONFIG_PATH, parseGatewayConfig } from '../../gateway/src/config/loadConfig.ts'

/** One listener of a service, read from the same variables the service itself reads. */
export interface ListenerSpec {
  hostVariable: string
  defaultHost: string
  portVariable: string
  defaultPort: number
}

/** A service `npm start` runs as a child process. Adding one to the stack is one entry in SERVICES. */
export interface ServiceSpec {
  name: string
  /** Entry point, relative to the repository root. */
  entry: string
  api: ListenerSpec & { note: string }
  /** Must serve GET /readyz (200 once ready). */
  ops: ListenerSpec
}

/** The gateway's listeners as its config file sets them (a broken file is reported once start.ts checks it). */
function readGatewayDefaults(): { host: string; port: number; opsHost: string; opsPort: number } {
  const fallback = { host: '0.0.0.0', port: 8080, opsHost: '0.0.0.0', opsPort: 9464 }
  try {
    const file = parseGatewayConfig(readFileSync(process.env.GATEWAY_CONFIG || DEFAULT_CONFIG_PATH, 'utf8'))
    return { ...fallback, ...file.server }
  } catch {
    return fallback
  }
}

const gatewayDefaults = readGatewayDefaults()

export const SERVICES: readonly ServiceSpec[] = [
  {
    name: 'pets-service',
    entry: 'pets-service/src/main.ts',
    api: {
      hostVariable: 'PETS_HOST',
      defaultHost: '127.0.0.1',
      portVariable: 'PETS_PORT',
      defaultPort: 3001,
      note: 'internal: requires x-internal-token',
    },
    ops: { hostVariable: 'PETS_OPS_HOST', defaultHost: '127.0.0.1', portVariable: 'PETS_OPS_PORT', defaultPort: 9465 },
  },
  // After the pets-service, so it stops first. start.ts hands it PETS_URL, DATABASE_URL and
  // INTERNAL_TOKEN; its listeners default to config/gateway.yaml's, as the gateway's own do.
  {
    name: 'gateway',
    entry: 'gateway/src/main.ts',
    api: {
      hostVariable: 'GATEWAY_HOST',
      defaultHost: gatewayDefaults.host,
      portVariable: 'GATEWAY_PORT',
      defaultPort: gatewayDefaults.port,
      note: 'public API under /v1',
    },
    ops: {
      hostVariable: 'GATEWAY_OPS_HOST',
      defaultHost: gatewayDefaults.opsHost,
      portVariable: 'GATEWAY_OPS_PORT',
      defaultPort: gatewayDefaults.opsPort,
    },
  },
]

export interface ResolvedListener {
  host: string
  port: number
  /** It serves HTTPS (the gateway's public port with server.tls). */
  tls?: boolean
}

export function resolveListener(spec: ListenerSpec, env: NodeJS.ProcessEnv): ResolvedListener {
  // Checked as the service checks it: a malformed host came back as getaddrinfo's words, naming no variable.
  return { host: listenHostFromEnv(spec.hostVariable, spec.defaultHost, env), port: portFromEnv(spec.portVariable, spec.defaultPort, env) }
}

/** Where to reach a listener from this machine: a wildcard bind is reached over loopback. */
const isWildcard = (host: string) => host === '0.0.0.0' || host === '::' || host === ''

/** For the ready lines: the URL, and whether other machines can reach it too. */
export function describeListener(listener: ResolvedListener): string {
  return isWildcard(listener.host) ? `${reachableUrl(listener)} [every interface]` : reachableUrl(listener)
}

export function reachableUrl({ host, port, tls }: ResolvedListener): string {
  const reachable = isWildcard(host) ? '127.0.0.1' : host
  return `${tls ? 'https' : 'http'}://${reachable.includes(':') ? `[${reachable}]` : reachable}:${port}`
}

export interface RunningChild {
  spec: ServiceSpec
  process: ChildProcess
  /** Settles when the process has exited, with how it exited. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  hasExited(): boolean
}

const EXIT_WITH_PARENT = new URL('./exitWithParent.ts', import.meta.url).href

/**
 * Runs `node --import tsx <entry>` from the repository root with the given environment. Its
 * stdout and stderr are the parent's, so the JSON logs appear as they are. The child gets its own
 * process group (a terminal's Ctrl-C reaches only the parent, which stops the children one
 * signal each) and an IPC channel whose closing tells it the parent is gone.
 */
export function spawnService(spec: ServiceSpec, root: string, env: NodeJS.ProcessEnv): RunningChild {
  const child = spawn(process.execPath, ['--import', 'tsx', '--import', EXIT_WITH_PARENT, path.join(root, spec.entry)], {
    cwd: root,
    env,
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    detached: true,
  })
  let done = false
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => {
      done = true
      resolve({ code, signal })
    })
    child.once('error', () => {
      // Spawning itself failed (no 'exit' follows).
      if (!done) {
        done = true
        resolve({ code: null, signal: null })
      }
    })
  })
  return { spec, process: child, exited, hasExited: () => done }
}

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/**
 * Polls GET /readyz until it answers 200. Fails when the child exits first or time runs out, then
 * with the last answer, which names the dependency that is down and, when it can, why.
 */
export async function waitUntilReady(child: RunningChild, readyzUrl: string, timeoutMillis: number): Promise<void> {
  const deadline = Date.now() + timeoutMillis
  let last = ''
  while (Date.now() < deadline) {
    if (child.hasExited()) throw new Error(`${child.spec.name} exited before it was ready`)
    try {
      // undici's request, not fetch, which refuses the ports browsers block (GATEWAY_OPS_PORT=6000).
      const response = await request(readyzUrl, { signal: AbortSignal.timeout(2_000) })
      if (response.statusCode === 200) {
        await response.body.dump()
        return
      }
      last = `; it answered ${response.statusCode} ${(await response.body.text()).slice(0, 500)}`
    } catch {
      // Not listening yet.
    }
    await Promise.race([sleep(250), child.exited])
  }
  throw new Error(`${child.spec.name} was not ready within ${Math.round(timeoutMillis / 1000)} s (${readyzUrl})${last}`)
}

/** SIGTERM, then SIGKILL after `graceMillis`. Resolves true when the child stopped within the grace. */
export async function stopChild(child: RunningChild, graceMillis: number): Promise<boolean> {
  if (child.hasExited()) return true
  child.process.kill('SIGTERM')
  let timer: NodeJS.Timeout | undefined
  const timedOut = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), graceMillis)
  })
  const outcome = await Promise.race([child.exited, timedOut])
  clearTimeout(timer)
  if (outcome !== 'timeout') return true
  child.process.kill('SIGKILL')
  await child.exited
  return false
}
