import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Redis, type RedisOptions } from 'ioredis'
import { afterAll } from 'vitest'
import { canListen, freePort } from './ports.ts'

/**
 * Redis for the tests: REDIS_URL when set, else the local server on 127.0.0.1:6379. Every test
 * writes under its own key prefix and deletes only that prefix afterwards.
 */
export const TEST_REDIS_URL = process.env.REDIS_URL || 'redis://127.0.0.1:6379'

export function testKeyPrefix(): string {
  return `aas-test:${randomBytes(4).toString('hex')}:`
}

/**
 * A key prefix for the enclosing describe block (or file), deleted and checked by
 * deleteKeysWithPrefix in an afterAll. Call it before the hooks that start what writes under it:
 * vitest runs "after" hooks in reverse, so the deletion then comes after those have closed.
 */
export function suiteKeyPrefix(): string {
  const prefix = testKeyPrefix()
  afterAll(() => deleteKeysWithPrefix(prefix))
  return prefix
}

/** A Redis key name holding something shaped like an API key (`aas_` and 16+ base62 characters). */
export const KEY_SHAPED = /aas_[0-9A-Za-z]{16,}/

/** The names, with the key-shaped part cut short, so the report itself leaks no key. */
export function keyShapedNames(names: string[]): string[] {
  return names.filter((name) => KEY_SHAPED.test(name)).map((name) => name.replace(KEY_SHAPED, (key) => `${key.slice(0, 8)}…`))
}

/**
 * Deletes the test's prefix, and fails the caller (its afterAll) when a key name under it held
 * something shaped like an API key: Redis key names carry key ids, never keys.
 */
export async function deleteKeysWithPrefix(prefix: string, url = TEST_REDIS_URL): Promise<void> {
  const redis = new Redis(url)
  const leaked: string[] = []
  try {
    let cursor = '0'
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
      cursor = next
      leaked.push(...keyShapedNames(keys))
      if (keys.length > 0) await redis.del(...keys)
    } while (cursor !== '0')
  } finally {
    redis.disconnect()
  }
  if (leaked.length > 0) throw new Error(`Redis key names held an API key: ${leaked.slice(0, 5).join(', ')}`)
}

/** Every key name under `pattern`, read with SCAN (nothing is changed). */
export async function keyNames(pattern: string, url = TEST_REDIS_URL): Promise<string[]> {
  const redis = new Redis(url, { lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 })
  const names: string[] = []
  try {
    await redis.connect()
    let cursor = '0'
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
      cursor = next
      names.push(...keys)
    } while (cursor !== '0')
  } finally {
    redis.disconnect()
  }
  return names
}

export interface TestCluster {
  /** Every node as host:port; with replicas, masters and replicas alike (seeds for a client). */
  nodes: string[]
  /** The redis-server of nodes[i] is processes[i]. */
  processes: ChildProcess[]
  /** Empty cluster-enabled servers outside the cluster (spareNodes), for an operator to add. */
  spares: string[]
  /** SIGKILL the server at `node` (a node or a spare) and start it again on its port, with its cluster config and no data. */
  restart(node: string): Promise<void>
  close(): Promise<void>
}

export interface TestClusterOptions {
  /** 1: each master gets a replica that takes over when it fails (six nodes). Default 0 (three masters). */
  replicasPerMaster?: 0 | 1
  /** Extra servers started outside the cluster (TestCluster.spares). Default 0. */
  spareNodes?: number
  /** Every node's requirepass (and masterauth, for its replicas); the default user's password. Default none. */
  password?: string
  /**
   * TLS only, clients and cluster bus alike, with this certificate and its CA; clients need no
   * certificate of their own (as managed offerings ask none), unless `clientsNeedCertificate`
   * (Redis's own default, tls-auth-clients yes): then each must present one the CA signed (the
   * helper's own connections present the nodes'). Default plain TCP.
   */
  tls?: { certFile: string; keyFile: string; caFile: string; clientsNeedCertificate?: boolean }
  /**
   * The name every node announces in the slot map instead of its address (Redis 7's
   * cluster-announce-hostname, as managed offerings name their nodes); TestCluster.nodes use it too.
   */
  announceHostname?: string
}

/** A three-master Redis Cluster on loopback ports, made with the machine's redis-server. */
export async function startRedisCluster(options: TestClusterOptions = {}): Promise<TestCluster> {
  const replicas = options.replicasPerMaster ?? 0
  const { password, tls, announceHostname } = options
  const host = announceHostname ?? '127.0.0.1'
  const ownCertificate = tls?.clientsNeedCertificate ? { cert: readFileSync(tls.certFile), key: readFileSync(tls.keyFile) } : {}
  const client = { host, password, ...(tls ? { tls: { ca: readFileSync(tls.caFile), ...ownCertificate } } : {}) }
  const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-cluster-'))
  const members = 3 * (1 + replicas)
  const ports = await clusterPorts(members + (options.spareNodes ?? 0))
  const output = new Map<number, string>()
  const spawnNode = (port: number) => {
    const child = spawn(
      'redis-server',
      [
        '--port', String(port), '--bind', '127.0.0.1', '--cluster-enabled', 'yes',
        '--cluster-config-file', path.join(directory, `nodes-${port}.conf`), '--dir', directory,
        '--save', '', '--appendonly', 'no', '--cluster-node-timeout', '2000',
        ...(password === undefined ? [] : ['--requirepass', password, '--masterauth', password]),
        ...(tls === undefined
          ? []
          : ['--port', '0', '--tls-port', String(port), '--tls-cert-file', tls.certFile, '--tls-key-file', tls.keyFile,
              '--tls-ca-cert-file', tls.caFile, '--tls-auth-clients', tls.clientsNeedCertificate ? 'yes' : 'no', '--tls-cluster', 'yes', '--tls-replication', 'yes']),
        ...(announceHostname === undefined ? [] : ['--cluster-announce-hostname', announceHostname, '--cluster-preferred-endpoint-type', 'hostname']),
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    )
    // Kept so that a node that refuses to start can say why (its log goes to stdout).
    child.stdout!.on('data', (chunk: Buffer) => output.set(port, ((output.get(port) ?? '') + chunk.toString()).slice(-2000)))
    return child
  }
  const processes = ports.map(spawnNode)
  // Should the test worker die without its afterAll, the servers go with it.
  const killOnExit = () => processes.forEach((child) => child.kill('SIGKILL'))
  process.once('exit', killOnExit)
  const close = async () => {
    await Promise.all(
      processes.map((child) =>
        child.exitCode !== null || child.signalCode !== null
          ? undefined
          : new Promise<void>((resolve) => {
              child.once('exit', () => resolve())
              child.kill('SIGKILL')
            }),
      ),
    )
    process.off('exit', killOnExit)
    rmSync(directory, { recursive: true, force: true })
  }
  const all = ports.map((port) => `${host}:${port}`)
  const nodes = all.slice(0, members)
  const answering = (index: number) =>
    waitFor(async () => {
      const child = processes[index]!
      if (child.exitCode !== null) throw new ExitedError(`redis-server on port ${ports[index]} exited: ${output.get(ports[index]!) ?? ''}`)
      return (await ping(ports[index]!, client)) === 'PONG'
    })
  try {
    for (const index of ports.keys()) await answering(index)
    const auth = password === undefined ? [] : ['-a', password, '--no-auth-warning']
    const secure = tls === undefined ? [] : ['--tls', '--cacert', tls.caFile, ...(tls.clientsNeedCertificate ? ['--cert', tls.certFile, '--key', tls.keyFile] : [])]
    // Addresses, not the announced name: nodes meet each other at them.
    const addresses = ports.slice(0, members).map((port) => `127.0.0.1:${port}`)
    const created = spawnSync('redis-cli', [...auth, ...secure, '--cluster', 'create', ...addresses, '--cluster-replicas', String(replicas), '--cluster-yes'], {
      encoding: 'utf8',
      timeout: 30_000,
    })
    if (created.status !== 0) throw new Error(`redis-cli --cluster create failed: ${created.stderr || created.stdout}`)
    for (const port of ports.slice(0, members)) {
      await waitFor(async () => {
        const redis = new Redis({ ...client, port, lazyConnect: true, retryStrategy: () => null })
        redis.on('error', () => undefined)
        try {
          await redis.connect()
          if (!(await redis.cluster('INFO')).includes('cluster_state:ok')) return false
          // A replica counts once it has its master's data: only then can it take over.
          const replication = await redis.info('replication')
          return replication.includes('role:master') || replication.includes('master_link_status:up')
        } finally {
          redis.disconnect()
        }
      })
    }
  } catch (error) {
    await close()
    throw error
  }
  async function restart(node: string): Promise<void> {
    const index = all.indexOf(node)
    if (index < 0) throw new Error(`${node} is not a node of this cluster`)
    const child = processes[index]!
    if (child.exitCode === null && child.signalCode === null) {
      await new Promise<void>((resolve) => {
        child.once('exit', () => resolve())
        child.kill('SIGKILL')
      })
    }
    processes[index] = spawnNode(ports[index]!)
    await answering(index)
  }
  return { nodes, processes, spares: all.slice(members), restart, close }
}

async function ping(port: number, client: RedisOptions): Promise<string | undefined> {
  const redis = new Redis({ ...client, port, lazyConnect: true, retryStrategy: () => null })
  // A server not listening yet is an answer here (undefined), not an error to print.
  redis.on('error', () => undefined)
  try {
    await redis.connect()
    return await redis.ping()
  } catch {
    return undefined
  } finally {
    redis.disconnect()
  }
}

/** A server that will never answer: waiting for it stops at once, with its reason. */
class ExitedError extends Error {}

/**
 * Loopback ports for cluster nodes. Each node also listens on its port + 10000 (the cluster bus),
 * so that port must be free as well (freePort's ports leave room for it).
 */
async function clusterPorts(count: number): Promise<number[]> {
  const ports: number[] = []
  while (ports.length < count) {
    const port = await freePort()
    if (!ports.includes(port) && (await canListen(port + 10000))) ports.push(port)
  }
  return ports
}

async function waitFor(condition: () => Promise<boolean>, timeoutMillis = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMillis
  while (Date.now() < deadline) {
    const met = await condition().catch((error: unknown) => {
      if (error instanceof ExitedError) throw error
      return false
    })
    if (met) return
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error('timed out waiting for Redis')
}
