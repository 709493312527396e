import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Redis } from 'ioredis'
import { freePort } from './ports.ts'

/**
 * A private redis-server on a free loopback port, for tests that break Redis on purpose:
 * stop it (connections refused), kill and start it again on the same port (an empty script
 * cache), freeze it with SIGSTOP (a hung server) and thaw it with SIGCONT. Nothing else
 * talks to it, so its INFO commandstats count only what the test's gateways sent.
 */
export interface PrivateRedis {
  port: number
  url: string
  /** Starts the server on its port (again); resolves once it answers PING. */
  start(): Promise<void>
  /** SIGKILL, then waits for the process to be gone: the port refuses connections. */
  stop(): Promise<void>
  /** stop() then start() on the same port: every script and key is gone. */
  restart(): Promise<void>
  /** SIGSTOP: connections stay open and nothing is answered. */
  freeze(): void
  /** SIGCONT after freeze(). */
  thaw(): void
  /** A fresh admin connection (lazy: call connect()); the caller disconnects it. */
  admin(): Redis
  /** Calls of one command since the last reset, from INFO commandstats (e.g. "evalsha"). */
  commandCalls(command: string): Promise<{ calls: number; failed: number; rejected: number }>
  /** Stops the server for good and removes its directory. */
  close(): Promise<void>
}

export interface PrivateRedisOptions {
  /**
   * TLS only, with this certificate (for 127.0.0.1) and its CA: `url` is then rediss://, and
   * clients need no certificate of their own (as managed offerings ask none), unless
   * `clientsNeedCertificate` (Redis's own default, tls-auth-clients yes): then each must present
   * one the CA signed (admin() presents the server's). Default plain TCP.
   */
  tls?: { certFile: string; keyFile: string; caFile: string; clientsNeedCertificate?: boolean }
}

export async function startPrivateRedis(options: PrivateRedisOptions = {}): Promise<PrivateRedis> {
  const { tls } = options
  const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-redis-'))
  const port = await freePort()
  const url = `${tls ? 'rediss' : 'redis'}://127.0.0.1:${port}`
  let child: ChildProcess | undefined
  let frozen = false
  // Should the test worker die without its afterAll, the server goes with it.
  const killOnExit = () => child?.kill('SIGKILL')
  process.once('exit', killOnExit)

  const admin = () => {
    const client = new Redis({
      host: '127.0.0.1',
      port,
      lazyConnect: true,
      maxRetriesPerRequest: 1,
      retryStrategy: () => null,
      ...(tls ? { tls: { ca: readFileSync(tls.caFile), ...(tls.clientsNeedCertificate ? { cert: readFileSync(tls.certFile), key: readFileSync(tls.keyFile) } : {}) } } : {}),
    })
    // Failures surface on the commands; the connection-level event only needs a listener.
    client.on('error', () => undefined)
    return client
  }

  async function answers(): Promise<boolean> {
    const client = admin()
    try {
      await client.connect()
      return (await client.ping()) === 'PONG'
    } catch {
      return false
    } finally {
      client.disconnect()
    }
  }

  async function start(): Promise<void> {
    if (child) throw new Error('private redis-server already running')
    const server = spawn(
      'redis-server',
      [
        ...(tls
          ? ['--port', '0', '--tls-port', String(port), '--tls-cert-file', tls.certFile, '--tls-key-file', tls.keyFile, '--tls-ca-cert-file', tls.caFile, '--tls-auth-clients', tls.clientsNeedCertificate ? 'yes' : 'no']
          : ['--port', String(port)]),
        '--bind', '127.0.0.1', '--dir', directory, '--save', '', '--appendonly', 'no', '--protected-mode', 'yes',
      ],
      { stdio: 'ignore' },
    )
    child = server
    const exited = new Promise<void>((resolve) => server.once('exit', () => resolve()))
    const deadline = Date.now() + 10_000
    while (Date.now() < deadline) {
      if (await answers()) return
      if (server.exitCode !== null) break
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    server.kill('SIGKILL')
    await exited
    child = undefined
    throw new Error(`private redis-server did not start on port ${port}`)
  }

  async function stop(): Promise<void> {
    const server = child
    if (!server) return
    child = undefined
    if (server.exitCode !== null || server.signalCode !== null) return
    const exited = new Promise<void>((resolve) => server.once('exit', () => resolve()))
    server.kill('SIGKILL')
    if (frozen) {
      server.kill('SIGCONT')
      frozen = false
    }
    await exited
  }

  await start()
  return {
    port,
    url,
    start,
    stop,
    async restart() {
      await stop()
      await start()
    },
    freeze() {
      if (!child) throw new Error('private redis-server is not running')
      child.kill('SIGSTOP')
      frozen = true
    },
    thaw() {
      if (!child || !frozen) return
      child.kill('SIGCONT')
      frozen = false
    },
    admin,
    async commandCalls(command: string) {
      const client = admin()
      try {
        await client.connect()
        const info = await client.info('commandstats')
        const line = info.split('\n').find((entry) => entry.startsWith(`cmdstat_${command.toLowerCase()}:`))
        const field = (name: string) => Number(new RegExp(`[:,]${name}=(\\d+)`).exec(line ?? '')?.[1] ?? 0)
        return { calls: field('calls'), failed: field('failed_calls'), rejected: field('rejected_calls') }
      } finally {
        client.disconnect()
      }
    },
    async close() {
      await stop()
      process.off('exit', killOnExit)
      rmSync(directory, { recursive: true, force: true })
    },
  }
}
