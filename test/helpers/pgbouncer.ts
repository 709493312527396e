import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { reachable } from './postgres.ts'
import { freePort } from './ports.ts'

/**
 * A private PgBouncer on a free loopback port in front of one database of the test Postgres, for
 * tests of what a connection pooler changes (pool_mode transaction: each transaction may run on
 * another server connection). It logs in to Postgres with the database URL's own user and
 * password and lets any client in (auth_type any); nothing else uses it.
 */
export interface PrivatePgBouncer {
  /** postgres://<user>@127.0.0.1:<port>/<database>, through the pooler. */
  url: string
  close(): Promise<void>
}

export const PGBOUNCER_BIN = process.env.PGBOUNCER_BIN || '/usr/sbin/pgbouncer'

export function pgbouncerAvailable(): boolean {
  return existsSync(PGBOUNCER_BIN)
}

/** PgBouncer refuses to run as root: as root, it runs as the `postgres` user. */
function owner(): { uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined
  const id = (flag: string) => spawnSync('id', [flag, 'postgres'], { encoding: 'utf8' })
  const uid = id('-u')
  const gid = id('-g')
  if (uid.status !== 0 || gid.status !== 0) throw new Error('running as root, PgBouncer needs a postgres user to run as')
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) }
}

export async function startPgBouncer(databaseUrl: string, settings: Record<string, string>): Promise<PrivatePgBouncer> {
  const target = new URL(databaseUrl)
  const database = decodeURIComponent(target.pathname.slice(1))
  const user = decodeURIComponent(target.username || 'postgres')
  const password = decodeURIComponent(target.password)
  const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-pgbouncer-'))
  const runAs = owner()
  if (runAs) chownSync(directory, runAs.uid, runAs.gid)
  const port = await freePort()
  const quote = (value: string) => `'${value.replace(/'/g, "''")}'`
  const config = [
    '[databases]',
    `${database} = host=${target.hostname.replace(/^\[|\]$/g, '')} port=${target.port || 5432} dbname=${database} user=${user}${password ? ` password=${quote(password)}` : ''}`,
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${port}`,
    'unix_socket_dir =',
    'auth_type = any',
    ...Object.entries(settings).map(([name, value]) => `${name} = ${value}`),
  ].join('\n')
  const file = path.join(directory, 'pgbouncer.ini')
  writeFileSync(file, `${config}\n`)
  if (runAs) chownSync(file, runAs.uid, runAs.gid)
  let log = ''
  const child: ChildProcess = spawn(PGBOUNCER_BIN, [file], { cwd: directory, stdio: ['ignore', 'pipe', 'pipe'], ...runAs })
  const keep = (chunk: Buffer) => (log = (log + chunk.toString()).slice(-20_000))
  child.stdout?.on('data', keep)
  child.stderr?.on('data', keep)
  const killOnExit = () => child.kill('SIGKILL')
  process.once('exit', killOnExit)
  const url = `postgres://${encodeURIComponent(user)}@127.0.0.1:${port}/${encodeURIComponent(database)}`
  const close = async () => {
    process.off('exit', killOnExit)
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGKILL')
      await exited
    }
    rmSync(directory, { recursive: true, force: true })
  }
  const deadline = Date.now() + 15_000
  while (Date.now() < deadline && child.exitCode === null) {
    if (await reachable(url, 1_000)) return { url, close }
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  await close()
  throw new Error(`pgbouncer did not start on port ${port}:\n${log}`)
}
