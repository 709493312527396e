import { spawn, type ChildProcess } from 'node:child_process'
import { closeSync, openSync } from 'node:fs'
import net from 'node:net'
import { fileURLToPath } from 'node:url'

export const ROOT = fileURLToPath(new URL('../../', import.meta.url))

export { freePort } from '../helpers/ports.ts'

export interface Exit {
  code: number | null
  signal: NodeJS.Signals | null
}

export interface NodeProcess {
  child: ChildProcess
  pid: number
  /** Everything written to stdout and stderr so far (the children's logs included). */
  output(): string
  exited: Promise<Exit>
  hasExited(): boolean
  /** SIGKILL to the process, or to its whole process group when it was started detached. */
  kill(): void
}

const running = new Set<NodeProcess>()

/** `node --import tsx <script>` from the repository root with exactly `env`. */
export function startNode(script: string, env: NodeJS.ProcessEnv, options: { detached?: boolean } = {}): NodeProcess {
  return startProcess(process.execPath, ['--import', 'tsx', script], env, options)
}

/** `command args…` (found on env.PATH) from the repository root with exactly `env`, e.g. `npm start`. */
export function startProcess(command: string, args: string[], env: NodeJS.ProcessEnv, options: { detached?: boolean } = {}): NodeProcess {
  const child = spawn(command, args, {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: options.detached ?? false,
  })
  let text = ''
  child.stdout?.on('data', (chunk: Buffer) => (text += chunk.toString()))
  child.stderr?.on('data', (chunk: Buffer) => (text += chunk.toString()))
  let done = false
  const exited = new Promise<Exit>((resolve) => {
    // 'exit', not 'close': grandchildren may hold the pipes a little longer.
    child.once('exit', (code, signal) => {
      done = true
      resolve({ code, signal })
    })
  })
  const handle: NodeProcess = {
    child,
    pid: child.pid ?? -1,
    output: () => text,
    exited,
    hasExited: () => done,
    kill() {
      if (done) return
      try {
        if (options.detached) process.kill(-handle.pid, 'SIGKILL')
        else child.kill('SIGKILL')
      } catch {
        // Already gone.
      }
    },
  }
  running.add(handle)
  void exited.then(() => running.delete(handle))
  return handle
}

/** For afterEach: SIGKILLs every process the tests started that is still running. */
export async function killAll(): Promise<void> {
  const left = [...running]
  for (const handle of left) handle.kill()
  await Promise.all(left.map((handle) => handle.exited))
}

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/** Polls `url` until it answers 200; fails early, with the process output, if the process exits. */
export async function waitForReady(url: string, proc: NodeProcess, timeoutMillis: number): Promise<void> {
  const deadline = Date.now() + timeoutMillis
  while (Date.now() < deadline) {
    if (proc.hasExited()) {
      const { code, signal } = await proc.exited
      throw new Error(`process exited (code ${code}, signal ${signal}) before ${url} was ready:\n${proc.output()}`)
    }
    try {
      const response = await fetch(url, { signal: AbortSignal.timeout(2_000) })
      await response.body?.cancel()
      if (response.status === 200) return
    } catch {
      // Not listening yet.
    }
    await sleep(200)
  }
  throw new Error(`${url} was not ready within ${timeoutMillis} ms:\n${proc.output()}`)
}

/** Waits until the process has printed `text`; fails early, with the output, if it exits. */
export async function waitForOutput(proc: NodeProcess, text: string, timeoutMillis: number): Promise<void> {
  const deadline = Date.now() + timeoutMillis
  while (!proc.output().includes(text)) {
    if (proc.hasExited()) throw new Error(`process exited before printing "${text}":\n${proc.output()}`)
    if (Date.now() > deadline) throw new Error(`"${text}" not printed within ${timeoutMillis} ms:\n${proc.output()}`)
    await sleep(100)
  }
}

/** Waits until nothing accepts connections on 127.0.0.1:port any more. */
export async function waitForPortClosed(port: number, timeoutMillis: number): Promise<void> {
  const deadline = Date.now() + timeoutMillis
  while (Date.now() < deadline) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect({ host: '127.0.0.1', port })
      socket.once('connect', () => {
        socket.destroy()
        resolve(true)
      })
      socket.once('error', () => resolve(false))
    })
    if (!open) return
    await sleep(100)
  }
  throw new Error(`127.0.0.1:${port} still accepts connections after ${timeoutMillis} ms`)
}

/** Resolves with the exit, or rejects when the process is still running after `timeoutMillis`. */
export async function exitWithin(proc: NodeProcess, timeoutMillis: number): Promise<Exit> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`still running after ${timeoutMillis} ms:\n${proc.output()}`)), timeoutMillis)
  })
  try {
    return await Promise.race([proc.exited, timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** The environment of this test process without the variables the test wants to control. */
export function baseEnv(): NodeJS.ProcessEnv {
  // No drain on SIGTERM: the test's own keep-alive connections would hold every stop for 5 s.
  const env: NodeJS.ProcessEnv = { ...process.env, LOG_LEVEL: 'warn', SHUTDOWN_DRAIN_SECONDS: '0' }
  for (const name of ['DATABASE_URL', 'DATA_DIR', 'INTERNAL_TOKEN', 'EMBEDDED_POSTGRES_PORT']) delete env[name]
  for (const name of Object.keys(env)) if (/^(PETS|GATEWAY)_/.test(name)) delete env[name]
  return env
}

export const TOKEN = 'scripts-test-internal-token-0123456789'

export interface PetBody {
  id: number
  name: string
  categoryId: number
  status: string
}

/** The JSON body of a pet answer. */
export async function petBody(response: Response): Promise<PetBody> {
  return (await response.json()) as PetBody
}

/** A small client for the pets-service on `port`, with the internal credential. */
export function petsClient(port: number) {
  const base = `http://127.0.0.1:${port}`
  const headers = { 'x-internal-token': TOKEN }
  return {
    create: (body: unknown) =>
      fetch(`${base}/pets`, {
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      }),
    list: () => fetch(`${base}/pets`, { headers }),
    get: (id: number) => fetch(`${base}/pets/${id}`, { headers }),
  }
}

export interface CliRun {
  args: string[]
  code: number | null
  stdout: string
  stderr: string
}

/**
 * `npm run keys -- …` as an operator runs it, minus npm: the real CLI entry point in a child process.
 * `stdoutReader` stops reading the CLI's stdout as a pipe's reader can: `first-chunk` once it has
 * one chunk (`keys list | head -1`, a pager quit), `gone` before anything was written. Or there is
 * no reader: `dev-null` (`> /dev/null`), `closed` (the shell's `>&-`).
 */
export function runKeysCli(
  args: string[],
  env: NodeJS.ProcessEnv,
  timeoutMillis = 45_000,
  stdoutReader: 'whole' | 'first-chunk' | 'gone' | 'disk-full' | 'dev-null' | 'closed' = 'whole',
): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    // Linux's /dev/full fails every write with ENOSPC, as a full disk under `> key.json` does.
    const full = stdoutReader === 'disk-full' ? openSync('/dev/full', 'w') : undefined
    const command = [process.execPath, '--import', 'tsx', 'gateway/src/cli/keys.ts', ...args]
    // Node spawns nothing with an fd closed: a shell closes it, then runs the CLI in its place.
    const [file, ...rest] = stdoutReader === 'closed' ? ['/bin/sh', '-c', 'exec "$@" >&-', 'sh', ...command] : command
    const child = spawn(file!, rest, {
      cwd: ROOT,
      env,
      stdio: ['ignore', full ?? (stdoutReader === 'dev-null' || stdoutReader === 'closed' ? 'ignore' : 'pipe'), 'pipe'],
    })
    if (full !== undefined) closeSync(full)
    let stdout = ''
    let stderr = ''
    if (stdoutReader === 'gone') child.stdout?.destroy()
    child.stdout?.on('data', (chunk: Buffer) => {
      stdout += chunk.toString()
      if (stdoutReader === 'first-chunk') child.stdout?.destroy()
    })
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMillis)
    child.once('error', reject)
    child.once('close', (code) => {
      clearTimeout(timer)
      resolve({ args, code, stdout, stderr })
    })
  })
}
