import { spawn, type ChildProcess } from 'node:child_process'
import { closeSync, openSync, readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..')

/** A port nobody listens on right now (the OS picks it; the child binds it moments later). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.unref()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      )
    })
  })
}

export interface ChildServerOptions {
  /** Used in messages and as the log file's name. */
  name: string
  /** Script path relative to the repository root, run with `node --import tsx`. */
  script: string
  /** A program to run instead of the node script (nginx): `script` and `nodeArgs` are then unused. */
  command?: { file: string; args: string[] }
  env: Record<string, string>
  /** Extra node flags placed before `--import tsx` (profiling, …). */
  nodeArgs?: string[]
  /** Polled until it answers 2xx. */
  readyUrl: string
  readyHeaders?: Record<string, string>
  /** stdout and stderr of the child go here. */
  logFile: string
  readyTimeoutMillis?: number
}

export interface ChildServer {
  pid: number
  logFile: string
  /** Why the child is gone ("exited (code 1)"), or undefined while it runs. */
  exitReason(): string | undefined
  /** SIGTERM, then SIGKILL if the child has not exited within the grace period. */
  stop(graceMillis?: number): Promise<void>
}

export class ServerStartError extends Error {
  override name = 'ServerStartError'
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
  } catch {
    return '(no log)'
  }
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
  return new Promise((resolve) => child.once('exit', () => resolve()))
}

const delay = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/** Starts `node --import tsx <script>` from the repository root and waits until it is ready. */
export async function startChildServer(options: ChildServerOptions): Promise<ChildServer> {
  const log = openSync(options.logFile, 'w')
  let child: ChildProcess
  try {
    const [file, args] = options.command
      ? [options.command.file, options.command.args]
      : [process.execPath, [...(options.nodeArgs ?? []), '--import', 'tsx', options.script]]
    child = spawn(file, args, {
      cwd: REPO_ROOT,
      env: { ...process.env, SHUTDOWN_DRAIN_SECONDS: '0', ...options.env },
      stdio: ['ignore', log, log],
    })
  } finally {
    closeSync(log)
  }
  let failure: string | undefined
  child.once('error', (error) => (failure = `could not be spawned: ${error.message}`))
  child.once('exit', (code, signal) => (failure = `exited (${signal ? `signal ${signal}` : `code ${code}`})`))

  const server: ChildServer = {
    pid: child.pid ?? -1,
    logFile: options.logFile,
    exitReason: () => failure,
    async stop(graceMillis = 10_000) {
      if (child.exitCode !== null || child.signalCode !== null) return
      child.kill('SIGTERM')
      const done = await Promise.race([exited(child).then(() => true), delay(graceMillis).then(() => false)])
      if (!done) {
        child.kill('SIGKILL')
        await exited(child)
      }
    },
  }

  const deadline = Date.now() + (options.readyTimeoutMillis ?? 30_000)
  for (;;) {
    if (failure !== undefined) {
      throw new ServerStartError(
        `${options.name} ${failure} before it was ready; last log lines:\n${tail(options.logFile)}`,
      )
    }
    if (Date.now() > deadline) {
      await server.stop(2_000)
      throw new ServerStartError(
        `${options.name} was not ready at ${options.readyUrl} in time; last log lines:\n${tail(options.logFile)}`,
      )
    }
    try {
      const response = await fetch(options.readyUrl, {
        headers: options.readyHeaders ?? {},
        signal: AbortSignal.timeout(1_000),
      })
      await response.arrayBuffer()
      if (response.ok) return server
    } catch {
      // Not listening yet.
    }
    await delay(100)
  }
}
