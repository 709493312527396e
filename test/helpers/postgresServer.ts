import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { chmodSync, chownSync, copyFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { reachable } from './postgres.ts'
import { freePort } from './ports.ts'

/**
 * A private PostgreSQL server for tests that crash Postgres on purpose: initdb into a temporary
 * directory as the `postgres` user (initdb refuses root), the postmaster a direct child on a free
 * loopback port, with the server's defaults for durability (fsync on, synchronous_commit on).
 * `crash()` is `kill -9` of the postmaster and its backends together, so whatever sat in shared
 * memory (WAL buffers not yet written) is gone; `start()` again runs crash recovery from the WAL.
 * The OS page cache survives, so `fsync = off` is not caught; `synchronous_commit = off` is.
 * Nothing else uses it, so the shared server on 5432 is never touched.
 */
export interface PrivatePostgres {
  port: number
  /** postgres://postgres@127.0.0.1:<port>/postgres */
  url: string
  /** The same server over its Unix socket, which pg_hba.conf always trusts (`hba` replaces only the TCP lines). */
  socketUrl: string
  /** Starts the postmaster (again) and resolves once it accepts queries. */
  start(): Promise<void>
  /** SIGKILL to the postmaster and every backend at once (its process group), as a machine crash would stop them. */
  crash(): Promise<void>
  /** Stops the server for good and removes its directory. */
  close(): Promise<void>
}

export const POSTGRES_BIN = process.env.POSTGRES_BIN || '/usr/lib/postgresql/15/bin'

/** True when the machine can run a private server: the binaries, and a `postgres` user to own it. */
export function privatePostgresAvailable(): boolean {
  return existsSync(path.join(POSTGRES_BIN, 'initdb')) && postgresUser() !== undefined
}

function postgresUser(): { uid: number; gid: number } | undefined {
  const id = (flag: string) => spawnSync('id', [flag, 'postgres'], { encoding: 'utf8' })
  const uid = id('-u')
  const gid = id('-g')
  if (uid.status !== 0 || gid.status !== 0) return undefined
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) }
}

export interface PrivatePostgresOptions {
  /**
   * Serves TLS (ssl = on) with this certificate and key, and verifies client certificates against
   * `caFile` when given. The files are copied into the server's directory, owned by the server's
   * user, the key 0600 (Postgres refuses a key others can read).
   */
  ssl?: { certFile: string; keyFile: string; caFile?: string }
  /**
   * pg_hba.conf's lines for TCP connections, instead of initdb's `trust` ones: e.g.
   * `hostssl all all 127.0.0.1/32 cert` for a server that takes only a client certificate. The
   * Unix socket stays trusted (`socketUrl`), for the helper's own readiness check and the test's setup.
   */
  hba?: string[]
}

/** pg_hba.conf lines for a server that takes only TLS connections with a client certificate whose CN is the user (`cert`), no password. */
export const CLIENT_CERTIFICATE_HBA = ['hostssl all all 127.0.0.1/32 cert', 'hostssl all all ::1/128 cert']

/** `settings` are extra `-c name=value` server settings (the tests use the defaults); `options` TLS and pg_hba.conf (none: initdb's). */
export async function startPrivatePostgres(settings: Record<string, string> = {}, options: PrivatePostgresOptions = {}): Promise<PrivatePostgres> {
  const user = postgresUser()
  if (!user) throw new Error('no postgres user on this machine')
  // Running as root, the server must run as postgres; as any other user, as that user.
  const owner = process.getuid?.() === 0 ? user : undefined
  const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-postgres-'))
  if (owner) chownSync(directory, owner.uid, owner.gid)
  const data = path.join(directory, 'data')
  const env = { PATH: process.env.PATH, LANG: 'C', LC_ALL: 'C' }
  const initdb = spawnSync(path.join(POSTGRES_BIN, 'initdb'), ['-D', data, '-U', 'postgres', '-A', 'trust', '--no-sync', '-E', 'UTF8'], {
    encoding: 'utf8',
    env,
    cwd: directory,
    timeout: 60_000,
    ...owner,
  })
  if (initdb.status !== 0) {
    rmSync(directory, { recursive: true, force: true })
    throw new Error(`initdb failed: ${initdb.stderr || initdb.stdout}`)
  }
  const serverSettings = { ...settings }
  const own = (file: string, mode: number) => {
    chmodSync(file, mode)
    if (owner) chownSync(file, owner.uid, owner.gid)
  }
  if (options.ssl) {
    const { certFile, keyFile, caFile } = options.ssl
    const copy = (from: string, name: string, mode: number) => {
      const to = path.join(directory, name)
      copyFileSync(from, to)
      own(to, mode)
      return to
    }
    serverSettings.ssl = 'on'
    serverSettings.ssl_cert_file = copy(certFile, 'server.crt', 0o644)
    serverSettings.ssl_key_file = copy(keyFile, 'server.key', 0o600)
    if (caFile) serverSettings.ssl_ca_file = copy(caFile, 'ca.crt', 0o644)
  }
  if (options.hba) {
    const hbaFile = path.join(data, 'pg_hba.conf')
    writeFileSync(hbaFile, ['local all all trust', ...options.hba, ''].join('\n'))
    own(hbaFile, 0o600)
  }
  const port = await freePort()
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`
  const socketUrl = `postgres://postgres@/postgres?host=${encodeURIComponent(directory)}&port=${port}`
  // With pg_hba.conf's TCP lines replaced, the TCP URL may need what the test gives (a client certificate).
  const readinessUrl = options.hba ? socketUrl : url
  let child: ChildProcess | undefined
  let log = ''
  const killGroup = (server: ChildProcess) => {
    try {
      if (server.pid) process.kill(-server.pid, 'SIGKILL')
    } catch {
      // Already gone.
    }
  }
  const killOnExit = () => child && killGroup(child)
  process.once('exit', killOnExit)

  async function start(): Promise<void> {
    if (child) throw new Error('private postgres already running')
    const deadline = Date.now() + 30_000
    // After a crash the old backends may hold the shared memory for a moment: then the new
    // postmaster exits at once, and the next attempt gets through.
    while (Date.now() < deadline) {
      const server = spawn(
        path.join(POSTGRES_BIN, 'postgres'),
        [
          '-D', data, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-k', directory,
          ...Object.entries(serverSettings).flatMap(([name, value]) => ['-c', `${name}=${value}`]),
        ],
        // Its own process group, so a crash takes the backends and the WAL writer with it.
        { env, cwd: directory, stdio: ['ignore', 'ignore', 'pipe'], detached: true, ...owner },
      )
      server.stderr?.on('data', (chunk: Buffer) => (log = (log + chunk.toString()).slice(-20_000)))
      child = server
      while (Date.now() < deadline && server.exitCode === null && server.signalCode === null) {
        if (await reachable(readinessUrl, 1_000)) return
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      child = undefined
      killGroup(server)
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    throw new Error(`private postgres did not start on port ${port}:\n${log}`)
  }

  async function crash(): Promise<void> {
    const server = child
    if (!server) return
    child = undefined
    if (server.exitCode !== null || server.signalCode !== null) return
    const exited = new Promise<void>((resolve) => server.once('exit', () => resolve()))
    killGroup(server)
    await exited
  }

  try {
    await start()
  } catch (error) {
    process.off('exit', killOnExit)
    rmSync(directory, { recursive: true, force: true })
    throw error
  }
  return {
    port,
    url,
    socketUrl,
    start,
    crash,
    async close() {
      await crash()
      process.off('exit', killOnExit)
      rmSync(directory, { recursive: true, force: true })
    },
  }
}
