import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { parse, stringify } from 'yaml'
import { createPool } from '../../common/src/database/pool.ts'
import { DEFAULT_CONFIG_PATH, parseGatewayConfig, resolveGatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import { isWellFormedApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { banPolicy, limitsFor } from '../../gateway/src/rateLimit/planLimits.ts'
import { connectRedis, createRedisStore, redisReady } from '../../gateway/src/rateLimit/redisStore.ts'
import { REPO_ROOT, freePort, startChildServer } from '../lib/childServer.ts'
import type { PrivateRedis } from '../lib/redisServer.ts'
import { checkFirstPetsPage } from './petsPage.ts'
import { PROXY_PATH } from './proxyRows.ts'
import { petsService } from './petsService.ts'
import { firstFailure, privateRedis, staticUpstream } from './shared.ts'
import type { BenchTarget, ResponseSample, SharedService, TargetContext } from './types.ts'

/** Plans of the bench config: `bench` admits everything a run can send, `limited` one request a day. */
const BENCH_PLAN = 'bench'
const LIMITED_PLAN = 'limited'
const UNLIMITED = 1_000_000_000
/** The most the config schema allows: a key kept over its limit stays 429 and is never banned. */
const STRIKES = 1_000_000
/** How long the harness bans the banned row's key for (longer than any run). */
const BAN_MILLIS = 3_600_000

interface GatewayFixture extends SharedService {
  origin: string
  opsOrigin: string
  upstream: GatewayUpstream
  redis: PrivateRedis
  configFile: string
  /** Bearer tokens, one per row. */
  keys: { admitted: string; malformed: string; limited: string; banned: string }
}

/**
 * The repository's config/gateway.yaml with the limits a benchmark needs: a `bench` plan whose
 * limits no run reaches, a `limited` plan of one request a day, an anonymous (per-IP) limit no
 * run reaches (every request of the 401 row is anonymous and comes from 127.0.0.1), and strikes
 * at the schema's maximum so the 429 row's key stays limited and is never banned. Everything
 * else (windows, ban ladder, key cache, Redis budget, onStoreFailure) is the shipped config.
 */
export function benchGatewayConfig(): string {
  const file = parse(readFileSync(path.join(REPO_ROOT, DEFAULT_CONFIG_PATH), 'utf8')) as Record<string, Record<string, unknown>>
  file.plans = { ...file.plans, [BENCH_PLAN]: { perMinute: UNLIMITED, perDay: UNLIMITED }, [LIMITED_PLAN]: { perMinute: 1, perDay: 1 } }
  file.anonymous = { ...file.anonymous, perMinute: UNLIMITED }
  file.bans = { ...file.bans, strikes: STRIKES }
  const text = `# Written by bench/targets/gateway.ts for one benchmark run.\n${stringify(file)}`
  parseGatewayConfig(text, 'bench gateway config') // throws ConfigError naming the line if the shape drifted
  return text
}

/** A key of the right shape whose checksum is wrong: refused before any lookup. */
function malformedKey(valid: string): string {
  const last = valid.at(-1) === 'A' ? 'B' : 'A'
  const key = `${valid.slice(0, -1)}${last}`
  if (isWellFormedApiKey(key)) throw new Error('could not build a malformed key')
  return key
}

async function expectStatus(origin: string, token: string, status: number): Promise<void> {
  const response = await fetch(`${origin}${PROXY_PATH}`, {
    headers: { authorization: `Bearer ${token}` },
    signal: AbortSignal.timeout(5_000),
  })
  const body = await response.text()
  if (response.status !== status) throw new Error(`gateway answered ${response.status}, expected ${status}: ${body.slice(0, 200)}`)
}

/** Bans `keyId` in Redis through the gateway's own store, as a gateway does after enough strikes. */
async function banKey(redisUrl: string, configText: string, key: { id: string; plan: string }): Promise<void> {
  const config = resolveGatewayConfig(parseGatewayConfig(configText, 'bench gateway config'), {})
  const client = connectRedis({ url: redisUrl, commandTimeoutMillis: 2_000, keyPrefix: config.redis.keyPrefix })
  const store = createRedisStore(client)
  try {
    if (!(await redisReady(client, 5_000))) throw new Error(`Redis at ${redisUrl} is not ready`)
    // Same window shapes as the gateway (else it would not read the state), one strike to a ban.
    const request = {
      keyId: key.id,
      ...limitsFor({ plan: key.plan, perMinute: null, perDay: null }, config),
      bans: { ...banPolicy(config), strikes: 1, ladderMillis: [BAN_MILLIS] },
    }
    for (let attempt = 0; attempt < 10; attempt++) {
      if ((await store.consume(request)).outcome === 'banned') return
    }
    throw new Error(`key ${key.id} was not banned after 10 requests`)
  } finally {
    await store.close()
  }
}

/** What a gateway forwards to: the static upstream, or the real pets-service for the full stack. */
export interface GatewayUpstream extends SharedService {
  /** http://127.0.0.1:port, no path (the gateway's PETS_URL). */
  origin: string
  /** The x-internal-token the upstream requires; a random one when it checks none. */
  internalToken?: string
}

/**
 * A gateway process: the default one serves the four gateway rows; experiments start their own
 * with different env or node flags (BENCH_TARGETS=gateway,gateway-log-warn).
 */
export interface GatewayVariant {
  /** Shared-service id and log file name. */
  id: string
  env?: Record<string, string>
  /**
   * Modules replaced for this process only (repository-relative paths, original → replacement),
   * through the resolve hook in bench/experiments/swapModules.mjs.
   */
  swaps?: Record<string, string>
  /** Runs before the process starts (writes a generated replacement module); undone when it stops. */
  prepare?: () => Promise<() => Promise<void>>
  /** Its upstream; the static upstream when unset. */
  upstream?: (context: TargetContext) => Promise<GatewayUpstream>
}

const DEFAULT_GATEWAY: GatewayVariant = { id: 'gateway' }

/** The environment `gateway/src/main.ts` runs with in the bench: loopback ports, the bench's config, info logs. */
export function gatewayEnv(options: {
  databaseUrl: string
  redisUrl: string
  internalToken?: string
  petsUrl: string
  configFile: string
  port: number
  opsPort: number
}): Record<string, string> {
  return {
    DATABASE_URL: options.databaseUrl,
    REDIS_URL: options.redisUrl,
    INTERNAL_TOKEN: options.internalToken ?? randomBytes(24).toString('hex'),
    PETS_URL: options.petsUrl,
    GATEWAY_CONFIG: options.configFile,
    GATEWAY_HOST: '127.0.0.1',
    GATEWAY_PORT: String(options.port),
    GATEWAY_OPS_HOST: '127.0.0.1',
    GATEWAY_OPS_PORT: String(options.opsPort),
    LOG_LEVEL: 'info',
  }
}

async function startGateway(context: TargetContext, variant: GatewayVariant): Promise<GatewayFixture> {
  const upstream: GatewayUpstream = await (variant.upstream ?? staticUpstream)(context)
  const redis = await privateRedis(context)
  const [port, opsPort] = [await freePort(), await freePort()]
  const undo = (await variant.prepare?.()) ?? (async () => undefined)
  const swaps = Object.entries(variant.swaps ?? {})
  const configText = benchGatewayConfig()
  const configFile = path.join(context.logDir, `${variant.id}.bench.yaml`)
  await writeFile(configFile, configText)
  const origin = `http://127.0.0.1:${port}`
  const server = await startChildServer({
    name: variant.id,
    script: 'gateway/src/main.ts',
    nodeArgs: [...context.nodeArgs, ...(swaps.length > 0 ? ['--import', './bench/experiments/swapModules.mjs'] : [])],
    env: {
      ...gatewayEnv({
        databaseUrl: context.databaseUrl,
        redisUrl: redis.url,
        internalToken: upstream.internalToken,
        petsUrl: upstream.origin,
        configFile,
        port,
        opsPort,
      }),
      ...(swaps.length > 0 ? { BENCH_MODULE_SWAPS: swaps.map(([from, to]) => `${from}=${to}`).join(',') } : {}),
      ...variant.env,
    },
    readyUrl: `http://127.0.0.1:${opsPort}/readyz`,
    logFile: path.join(context.logDir, `${variant.id}.log`),
  })
  try {
    // The gateway has migrated its schema by the time it is ready; keys go in the way the CLI puts them.
    const pool = createPool({ connectionString: context.databaseUrl, applicationName: 'bench-keys', max: 1 })
    let keys: GatewayFixture['keys']
    try {
      const repository = createKeyRepository(pool)
      const admitted = await repository.create({ name: 'bench: admitted', plan: BENCH_PLAN })
      const limited = await repository.create({ name: 'bench: over its limit', plan: LIMITED_PLAN })
      const banned = await repository.create({ name: 'bench: banned', plan: LIMITED_PLAN })
      keys = { admitted: admitted.key, malformed: malformedKey(admitted.key), limited: limited.key, banned: banned.key }
      await expectStatus(origin, limited.key, 200) // its one request of the day
      await banKey(redis.url, configText, banned.record)
    } finally {
      await pool.end()
    }
    const opsOrigin = `http://127.0.0.1:${opsPort}`
    const stop = async () => {
      await server.stop()
      await undo()
    }
    return { origin, opsOrigin, upstream, redis, configFile, keys, pid: server.pid, failure: server.exitReason, stop }
  } catch (error) {
    await server.stop()
    await undo()
    throw error
  }
}

/**
 * From the gateway's /metrics: rate-limit decisions by source (store, fallback, ban_cache,
 * anonymous) and store errors by kind. A fallback decision is one Redis did not make (it failed
 * or missed its time budget), which is why an admitted row can send fewer than 1 command per request.
 */
export async function decisionCounters(opsOrigin: string): Promise<Record<string, number>> {
  const response = await fetch(`${opsOrigin}/metrics`, { signal: AbortSignal.timeout(5_000) })
  const text = await response.text()
  const counters: Record<string, number> = {}
  for (const line of text.split('\n')) {
    const decision = /^gateway_rate_limit_requests_total\{[^}]*source="([^"]+)"[^}]*\} (\d+(?:\.\d+)?)/.exec(line)
    if (decision?.[1] && decision[2]) counters[`decisions from ${decision[1]}`] = (counters[`decisions from ${decision[1]}`] ?? 0) + Number(decision[2])
    const error = /^gateway_rate_limit_store_errors_total\{[^}]*kind="([^"]+)"[^}]*\} (\d+(?:\.\d+)?)/.exec(line)
    if (error?.[1] && error[2]) counters[`store ${error[1]}s`] = (counters[`store ${error[1]}s`] ?? 0) + Number(error[2])
  }
  return counters
}

function errorBody(code: string, status: number) {
  return (response: ResponseSample): string | undefined => {
    if (response.status !== status) return `status ${response.status}: ${response.body.slice(0, 200)}`
    try {
      const body = JSON.parse(response.body) as { code?: unknown }
      return body.code === code ? undefined : `expected code ${code}: ${response.body.slice(0, 200)}`
    } catch {
      return `body is not JSON: ${response.body.slice(0, 200)}`
    }
  }
}

interface GatewayRow {
  variant?: GatewayVariant
  id: string
  label: string
  key: keyof GatewayFixture['keys']
  expectedStatus?: number
  description: string
  checkResponse(response: ResponseSample): string | undefined
  openLoop?: boolean
  /** Count the upstream's CPU as the row's own (the full stack: gateway + pets-service). */
  upstreamIsOwnCost?: boolean
  upstreamLabel?: string
}

function gatewayRow(row: GatewayRow): BenchTarget {
  return {
    id: row.id,
    label: row.label,
    request: `GET ${PROXY_PATH}`,
    description: row.description,
    ...(row.expectedStatus === undefined ? {} : { expectedStatus: row.expectedStatus }),
    ...(row.openLoop ? { openLoop: true } : {}),
    checkResponse: row.checkResponse,
    async start(context) {
      const variant = row.variant ?? DEFAULT_GATEWAY
      const gateway = await context.shared(variant.id, () => startGateway(context, variant))
      return {
        url: `${gateway.origin}${PROXY_PATH}`,
        headers: { authorization: `Bearer ${gateway.keys[row.key]}` },
        pids: row.upstreamIsOwnCost ? [gateway.pid, gateway.upstream.pid] : [gateway.pid],
        supporting: [
          ...(row.upstreamIsOwnCost ? [] : [{ role: 'upstream' as const, pid: gateway.upstream.pid }]),
          { role: 'Redis', pid: gateway.redis.pid },
        ],
        redis: gateway.redis,
        counters: () => decisionCounters(gateway.opsOrigin),
        failure: firstFailure(
          { name: 'gateway', failure: gateway.failure },
          { name: row.upstreamLabel ?? 'static upstream', failure: gateway.upstream.failure },
          { name: 'Redis', failure: gateway.redis.failure },
        ),
        // One gateway process serves all rows of its variant; the harness stops it once at the end.
        stop: async () => undefined,
      }
    },
  }
}

const GATEWAY_PROCESS =
  'gateway/src/main.ts in its own process (one process serves the four gateway rows): real Postgres key ' +
  'store (bench database, keys created with createKeyRepository().create), limits on the private Redis, ' +
  'LOG_LEVEL=info with its log written to a file, the bench config (config/gateway.yaml with a plan no run ' +
  'exhausts, a one-request-a-day plan, strikes 1,000,000)'

export const gatewayTarget = gatewayRow({
  id: 'gateway',
  label: 'gateway, admitted',
  key: 'admitted',
  openLoop: true,
  checkResponse: checkFirstPetsPage,
  description:
    `${GATEWAY_PROCESS}. A valid key (key cache hit), one EVALSHA for ban check + minute and day windows, ` +
    'rate-limit headers, header hygiene, the proxy to the static upstream, one log line.',
})

export const gateway401Target = gatewayRow({
  id: 'gateway-401',
  label: 'gateway, 401 malformed key',
  key: 'malformed',
  expectedStatus: 401,
  checkResponse: errorBody('invalid_api_key', 401),
  description:
    `${GATEWAY_PROCESS}. A key of the right shape with a wrong checksum: refused without a key lookup ` +
    'or a Redis call, counted in the per-IP anonymous limit in the gateway\'s memory, 401 invalid_api_key.',
})

export const gateway429Target = gatewayRow({
  id: 'gateway-429',
  label: 'gateway, 429 over its limit',
  key: 'limited',
  expectedStatus: 429,
  checkResponse: errorBody('rate_limited', 429),
  description:
    `${GATEWAY_PROCESS}. A key that used its one request of the day: one EVALSHA (limited, a strike that ` +
    'never reaches the ban threshold), 429 rate_limited with Retry-After.',
})

export const gatewayBannedTarget = gatewayRow({
  id: 'gateway-banned',
  label: 'gateway, 429 banned key',
  key: 'banned',
  expectedStatus: 429,
  checkResponse: errorBody('api_key_banned', 429),
  description:
    `${GATEWAY_PROCESS}. A key the harness banned for an hour through the gateway’s own Redis store; the ` +
    'response check learns the ban (one EVALSHA), every measured request is answered from the local ban cache.',
})

/**
 * The whole stack: a gateway of its own in front of the real pets-service (the same process the
 * pets-service row measures directly) on Postgres, an admitted key, the first page of pets.
 */
export const fullStackTarget = gatewayRow({
  variant: {
    id: 'gateway-full-stack',
    upstream: (context) => petsService(context, { id: 'pets-service', logLevel: 'info' }),
  },
  id: 'full-stack',
  label: 'full stack: gateway → pets-service → Postgres',
  key: 'admitted',
  checkResponse: checkFirstPetsPage,
  upstreamIsOwnCost: true,
  upstreamLabel: 'pets-service',
  description:
    `${GATEWAY_PROCESS.replace('one process serves the four gateway rows', 'its own process')}, PETS_URL = the ` +
    'pets-service row’s own process (LOG_LEVEL=info, the same INTERNAL_TOKEN), which reads the page from the ' +
    'bench database. Server CPU counts the gateway and the pets-service; Postgres is its own column.',
})

/**
 * An experiment: the admitted row on a gateway process of its own (the variant), everything else
 * as in the admitted row. The row's id is the variant's.
 */
function admittedExperiment(variant: GatewayVariant, label: string, description: string): BenchTarget {
  return gatewayRow({ variant, id: variant.id, label, key: 'admitted', checkResponse: checkFirstPetsPage, description })
}

/** Experiment: the admitted row with LOG_LEVEL=warn, i.e. without the one log line per request. */
export const gatewayLogWarnTarget = admittedExperiment(
  { id: 'gateway-log-warn', env: { LOG_LEVEL: 'warn' } },
  'gateway, admitted, LOG_LEVEL=warn (experiment)',
  `${GATEWAY_PROCESS.replace('LOG_LEVEL=info', 'LOG_LEVEL=warn')}, its own process. The admitted row without the request log line.`,
)

/**
 * Experiment: the admitted row on the in-process store (REDIS_URL empty, as `npm start` runs
 * without one): the same pipeline without the Redis round trip, so the difference is its cost.
 */
export const gatewayMemoryStoreTarget = admittedExperiment(
  { id: 'gateway-memory-store', env: { REDIS_URL: '' } },
  'gateway, admitted, in-process store (experiment)',
  `${GATEWAY_PROCESS.replace('limits on the private Redis', 'limits in the in-process store (REDIS_URL empty)')}, its own process.`,
)

/**
 * Experiment: the admitted row through the proxy stage as it was before tuning (every request
 * through @fastify/reply-from's reply.from), bench/experiments/upstreamProxyReplyFrom.ts swapped
 * in for gateway/src/proxy/upstreamProxy.ts by a module resolve hook.
 */
export const gatewayReplyFromTarget = admittedExperiment(
  { id: 'gateway-reply-from', swaps: { 'gateway/src/proxy/upstreamProxy.ts': 'bench/experiments/upstreamProxyReplyFrom.ts' } },
  'gateway, admitted, proxy via reply.from (experiment)',
  `${GATEWAY_PROCESS}, its own process, with the proxy stage before tuning ` +
    '(bench/experiments/upstreamProxyReplyFrom.ts: @fastify/http-proxy handing every request to reply.from).',
)

const GENERATED = path.join(REPO_ROOT, 'bench', 'experiments', 'generated')

/**
 * gateway/src/rateLimit/redisStore.ts with one change (ioredis `enableAutoPipelining: true`),
 * written to bench/experiments/generated/ for the run and removed afterwards.
 */
async function autoPipeliningStore(): Promise<() => Promise<void>> {
  const source = await readFile(path.join(REPO_ROOT, 'gateway/src/rateLimit/redisStore.ts'), 'utf8')
  const patched = source
    .replace('lazyConnect: false,', 'lazyConnect: false,\n    enableAutoPipelining: true,')
    .replaceAll("from './", "from '../../../gateway/src/rateLimit/")
  if (!patched.includes('enableAutoPipelining: true')) throw new Error('redisStore.ts changed shape: cannot patch in enableAutoPipelining')
  await mkdir(GENERATED, { recursive: true })
  const file = path.join(GENERATED, 'redisStoreAutoPipelining.ts')
  await writeFile(file, `// Generated by bench/targets/gateway.ts for one run; deleted when it ends.\n${patched}`)
  return () => rm(GENERATED, { recursive: true, force: true })
}

/**
 * Experiment: the admitted row with ioredis auto-pipelining, i.e. the EVALSHAs of requests handled
 * in the same event-loop turn sent in one write and answered in one read.
 */
export const gatewayAutoPipeliningTarget = admittedExperiment(
  {
    id: 'gateway-autopipelining',
    swaps: { 'gateway/src/rateLimit/redisStore.ts': 'bench/experiments/generated/redisStoreAutoPipelining.ts' },
    prepare: autoPipeliningStore,
  },
  'gateway, admitted, Redis auto-pipelining (experiment)',
  `${GATEWAY_PROCESS}, its own process, with redisStore.ts's ioredis client created with ` +
    '`enableAutoPipelining: true` (a generated copy swapped in; nothing else changed).',
)
