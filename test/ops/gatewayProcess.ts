import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { parse, stringify } from 'yaml'
import type { GatewayConfigFile } from '../../gateway/src/config/schema.ts'
import { baseEnv, freePort, startNode, startProcess, waitForReady, type NodeProcess } from '../scripts/processes.ts'

export const OPS_TEST_TOKEN = 'ops-test-internal-token-0123456789'

export interface GatewayProcess {
  proc: NodeProcess
  url: string
  opsUrl: string
  opsPort: number
  apiPort: number
  readyz(): Promise<{ status: number; body: ReadyzBody }>
}

export interface ReadyzBody {
  status?: string
  dependencies?: Record<string, string>
  reasons?: Record<string, string>
}

/**
 * The real gateway entry point (`node --import tsx gateway/src/main.ts`) as a child process on
 * free loopback ports, so signals, readiness and shutdown are the production code paths.
 * `configure` edits a copy of config/gateway.yaml that GATEWAY_CONFIG then names.
 */
/**
 * The environment `gateway/src/main.ts` runs with in these tests: its own free loopback ports, no
 * Redis unless `extra` names one, the ops tests' internal credential.
 */
export async function gatewayProcessEnv(options: { databaseUrl: string; petsUrl: string; internalToken?: string; extra?: NodeJS.ProcessEnv }) {
  const [apiPort, opsPort] = [await freePort(), await freePort()]
  const env: NodeJS.ProcessEnv = {
    ...baseEnv(),
    REDIS_URL: '',
    REDIS_CLUSTER_NODES: '',
    ...options.extra,
    DATABASE_URL: options.databaseUrl,
    INTERNAL_TOKEN: options.internalToken ?? OPS_TEST_TOKEN,
    PETS_URL: options.petsUrl,
    GATEWAY_HOST: '127.0.0.1',
    GATEWAY_PORT: String(apiPort),
    GATEWAY_OPS_HOST: '127.0.0.1',
    GATEWAY_OPS_PORT: String(opsPort),
  }
  return { env, apiPort, opsPort }
}

export async function startGatewayProcess(options: {
  databaseUrl: string
  petsUrl: string
  env?: NodeJS.ProcessEnv
  configure?: (file: GatewayConfigFile) => void
  readyTimeoutMillis?: number
  /** The test expects it not to become ready: wait only until it has started (/readyz no longer "starting"). */
  notReady?: boolean
  internalToken?: string
  /** Starts it under this open-file limit (soft and hard, through prlimit), as a container's or a unit's nofile sets it. */
  openFileLimit?: number
}): Promise<GatewayProcess & { configPath: string; cleanup(): void }> {
  const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-ops-'))
  const configPath = path.join(directory, 'gateway.yaml')
  const file = parse(readFileSync('config/gateway.yaml', 'utf8')) as GatewayConfigFile
  options.configure?.(file)
  writeFileSync(configPath, stringify(file))
  const { env, apiPort, opsPort } = await gatewayProcessEnv({
    databaseUrl: options.databaseUrl,
    petsUrl: options.petsUrl,
    internalToken: options.internalToken,
    extra: { ...options.env, GATEWAY_CONFIG: configPath },
  })
  const proc = options.openFileLimit === undefined
    ? startNode('gateway/src/main.ts', env)
    : startProcess('prlimit', [`--nofile=${options.openFileLimit}:${options.openFileLimit}`, process.execPath, '--import', 'tsx', 'gateway/src/main.ts'], env)
  const opsUrl = `http://127.0.0.1:${opsPort}`
  const timeoutMillis = options.readyTimeoutMillis ?? 15_000
  const readyz = async () => {
    const response = await fetch(`${opsUrl}/readyz`, { signal: AbortSignal.timeout(3_000) })
    return { status: response.status, body: (await response.json()) as ReadyzBody }
  }
  try {
    if (options.notReady) {
      // The ops port answers from the start of start-up; the process has started when /readyz stops saying so.
      await waitForReady(`${opsUrl}/healthz`, proc, timeoutMillis)
      const deadline = Date.now() + timeoutMillis
      while ((await readyz()).body.status === 'starting') {
        if (Date.now() > deadline) throw new Error(`the gateway was still starting after ${timeoutMillis} ms:\n${proc.output()}`)
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
    } else {
      await waitForReady(`${opsUrl}/readyz`, proc, timeoutMillis)
    }
  } catch (error) {
    // No handle reaches the test, so nothing else would stop the process or remove its config.
    proc.child.kill('SIGKILL')
    rmSync(directory, { recursive: true, force: true })
    throw error
  }
  return {
    proc,
    url: `http://127.0.0.1:${apiPort}`,
    opsUrl,
    opsPort,
    apiPort,
    readyz,
    configPath,
    cleanup: () => rmSync(directory, { recursive: true, force: true }),
  }
}

// The relay moved to test/helpers/tcpRelay.ts, where the fault tests share it.
export { cuttableRelay } from '../helpers/tcpRelay.ts'
