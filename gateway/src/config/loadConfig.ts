import { closeSync, fstatSync, openSync, readFileSync } from 'node:fs'
import { dirname, isAbsolute, resolve } from 'node:path'
import proxyAddr from '@fastify/proxy-addr'
import ipaddr from 'ipaddr.js'
import { Ajv, type ErrorObject } from 'ajv'
import { LineCounter, isAlias, isCollection, isNode, isPair, isScalar, isSeq, parseDocument, visit, type Document, type YAMLError } from 'yaml'
import {
  EnvError,
  httpUrlProblem,
  upstreamUrlProblem,
  listenHostFromEnv,
  listenHostProblem,
  listenersCollide,
  listenersCollideProblem,
  maxConnectionsFromEnv,
  portFromEnv,
  urlScheme,
} from '../../../common/src/env.ts'
import { isPlainIpv4 } from '../rateLimit/clientAddress.ts'
import { REDIS_BYTES_PER_KEY_BUDGET, bytesPerActiveKey } from '../rateLimit/redisFootprint.ts'
import { GatewayConfigSchema, type GatewayConfigFile } from './schema.ts'
import { TlsFilesError, readTlsPair, type TlsFiles } from './tlsFiles.ts'

export const DEFAULT_CONFIG_PATH = 'config/gateway.yaml'

/**
 * server.maxConnectionsPerClient when the config leaves it unset: far above what a client's pool
 * or a NAT of busy users holds, far below the public port's cap, so one address cannot take it.
 */
export const DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 1_000

export type PlanLimit = number | 'custom'

export interface UpstreamConfig {
  url: string
  timeoutMillis: number
  /** Requests handed to the upstream and not yet ended beyond which another is refused with 503. */
  maxInFlight: number
}

export interface GatewayConfig {
  server: {
    host: string
    port: number
    opsHost: string
    opsPort: number
    trustedProxies: string[]
    /** Client connections the public port holds at once; undefined: derived from the open-file limit at start (connectionCap.ts). */
    maxConnections?: number
    /** Client connections one client address holds at once (connectionsPerClient.ts); a trusted proxy's are not capped. */
    maxConnectionsPerClient: number
    /**
     * The public port serves HTTPS with this pair (absolute paths); undefined: plain HTTP, TLS
     * terminating in front of the gateway. The files are re-read on SIGHUP and when they change.
     */
    tls?: TlsFiles
  }
  upstreams: {
    pets: UpstreamConfig
    orders?: UpstreamConfig
  }
  keyCache: { maxEntries: number; ttlMillis: number; negativeTtlMillis: number }
  plans: Readonly<Record<string, { perMinute: PlanLimit; perDay: PlanLimit }>>
  windows: { minute: { lengthMillis: number; bucketMillis: number }; day: { lengthMillis: number; bucketMillis: number } }
  anonymous: { perMinute: number }
  bans: { strikes: number; ladderSeconds: number[] }
  onStoreFailure: 'open' | 'closed'
  redis: {
    /** REDIS_URL; with neither this nor clusterNodes the in-process store is used. */
    url?: string
    clusterNodes?: string[]
    /**
     * REDIS_USERNAME and REDIS_PASSWORD: the AUTH of every connection, each Cluster node's too
     * (REDIS_URL carries its own, and may not be given both ways). Never logged nor shown.
     */
    username?: string
    password?: string
    /**
     * REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE (absolute paths): the certificate every TLS
     * connection to Redis presents, for a server that asks clients for one (tls-auth-clients).
     */
    clientCertificate?: TlsFiles
    commandTimeoutMillis: number
    keyPrefix: string
  }
  /** The servers the OpenAPI document at /v1/openapi.json names. */
  openapi: { servers: { production: string; staging: string } }
}

/** Used when config/gateway.yaml has no `openapi` section. */
export const DEFAULT_API_SERVERS = {
  production: 'https://api.example.com/v1',
  staging: 'https://staging-api.example.com/v1',
} as const

/** A config file that cannot be used; each problem names the file, line and key. */
export class ConfigError extends Error {
  readonly problems: string[]
  constructor(problems: string[]) {
    super(`invalid gateway config:\n  ${problems.join('\n  ')}`)
    this.name = 'ConfigError'
    this.problems = problems
  }
}

const validate = new Ajv({ allErrors: true, strict: false, verbose: true }).compile(GatewayConfigSchema)
const DEFAULT_TIMEOUT_SECONDS = 10
/** Envoy's default for its circuit breakers' pending and active requests: about 7 MB of held requests at most. */
export const DEFAULT_MAX_IN_FLIGHT = 1_024
const UNIT_SECONDS = { s: 1, m: 60, h: 3_600, d: 86_400 } as const

export function durationSeconds(text: string): number {
  const unit = text.at(-1) as keyof typeof UNIT_SECONDS
  return Number(text.slice(0, -1)) * UNIT_SECONDS[unit]
}

/** A schema error as `path message`; `at` is the key whose line is reported, when not `path` itself. */
function describe(error: ErrorObject): { path: string[]; message: string; at?: string[] } {
  const path = error.instancePath.split('/').slice(1).map((part) => part.replace(/~1/g, '/').replace(/~0/g, '~'))
  if (error.keyword === 'additionalProperties') {
    return { path: [...path, String(error.params.additionalProperty)], message: 'unknown key' }
  }
  if (error.keyword === 'required') {
    // The line of the section that lacks it (`plans:`), not of whatever comes first inside it.
    return { path: [...path, String(error.params.missingProperty)], message: 'is required', at: path }
  }
  if (error.keyword === 'anyOf' || error.keyword === 'const') {
    return { path, message: 'must be a positive integer or "custom"' }
  }
  if (error.keyword === 'enum') {
    return { path, message: `must be one of ${(error.params.allowedValues as string[]).join(', ')}` }
  }
  if ((error.keyword === 'pattern' || error.keyword === 'type') && error.parentSchema?.description) {
    return { path, message: `must be ${error.parentSchema.description}` }
  }
  return { path, message: error.message ?? 'is invalid' }
}

/** The line of the deepest node of `path` that exists in the document. */
function lineOf(document: Document, lines: LineCounter, path: string[]): number {
  for (let depth = path.length; depth >= 0; depth--) {
    const node = depth === 0 ? document.contents : document.getIn(path.slice(0, depth), true)
    if (isNode(node) && node.range) {
      return lines.linePos(node.range[0]).line
    }
  }
  return 1
}

/** For an unknown key, the line of the key itself rather than of its value. */
function keyLine(document: Document, lines: LineCounter, path: string[]): number {
  const parent = path.length > 1 ? document.getIn(path.slice(0, -1), true) : document.contents
  const last = path.at(-1)
  if (parent && typeof parent === 'object' && 'items' in parent && Array.isArray(parent.items)) {
    for (const item of parent.items as unknown[]) {
      const key = (item as { key?: { value?: unknown; range?: [number, number, number] } }).key
      if (key && key.value === last && key.range) return lines.linePos(key.range[0]).line
    }
  }
  return lineOf(document, lines, path)
}

/**
 * The line of a syntax error. The parser reports where it noticed the problem; for a flow
 * collection left open (`{ perMinute: 60, perDay: 1000` without its `}`) that is the next line,
 * so the error is moved to the line where the unclosed collection starts.
 */
function syntaxErrorLine(text: string, document: Document, lines: LineCounter, error: YAMLError): number {
  let line = lines.linePos(error.pos[0]).line
  visit(document, (_key, node) => {
    if (!isCollection(node) || !node.flow || !node.range) return
    const [start, valueEnd, end] = node.range
    const closed = text.slice(start, valueEnd).trimEnd().endsWith(isSeq(node) ? ']' : '}')
    if (!closed && end === error.pos[0]) line = lines.linePos(start).line
  })
  return line
}

/** The parser's message; for a key given twice, which one (`plans.free`), as a long file may hold it at two far-apart lines. */
function syntaxErrorMessage(document: Document, error: YAMLError): string {
  const message = error.message.split('\n')[0]!
  if (error.code !== 'DUPLICATE_KEY') return message
  let duplicate: string | undefined
  visit(document, {
    Pair(_key, pair, ancestors) {
      if (!isScalar(pair.key) || pair.key.range?.[0] !== error.pos[0]) return
      const outer = ancestors.flatMap((node) => (isPair(node) && isScalar(node.key) ? [String(node.key.value)] : []))
      duplicate = [...outer, String(pair.key.value)].join('.')
      return visit.BREAK
    },
  })
  return duplicate === undefined ? message : `${message}: ${duplicate} is set twice`
}

/** Aliases naming no anchor said one by one, at most; the rest are counted. */
const MAX_UNRESOLVED_ALIASES_SAID = 10

/**
 * The document as plain values. The YAML library refuses aliases that would expand into more
 * copies than it allows (a "billion laughs" file, a few lines that would fill the memory) by
 * throwing a ReferenceError, which reached check-config's user as a stack trace and the reload
 * log without a line: said here as a problem of the file, at its last alias.
 */
function expanded(document: Document, lines: LineCounter, source: string): unknown {
  try {
    return document.toJS()
  } catch (error) {
    if (!(error instanceof ReferenceError)) throw error
    // An alias naming no anchor set before it (a typo, `*Free` for `&free`) throws the same error:
    // it was said as an alias bomb, at the last alias of the file.
    // One walk in document order (Alias.resolve walks the whole document for each alias: a 64 KiB
    // file of aliases took a minute), and a bounded list of problems.
    let last = 0
    let unresolvedCount = 0
    let firstUnsaid = 0
    const unresolved: string[] = []
    const anchors = new Set<string>()
    visit(document, {
      Node(_key, node) {
        if (!isAlias(node)) {
          if (node.anchor) anchors.add(node.anchor)
          return
        }
        if (!node.range) return
        last = Math.max(last, node.range[0])
        if (anchors.has(node.source)) return
        if (unresolvedCount++ === MAX_UNRESOLVED_ALIASES_SAID) firstUnsaid = node.range[0]
        if (unresolvedCount <= MAX_UNRESOLVED_ALIASES_SAID) {
          unresolved.push(`${source}:${lines.linePos(node.range[0]).line}: the alias *${node.source} names no anchor (&${node.source}) set before it`)
        }
      },
    })
    if (unresolvedCount > unresolved.length) {
      unresolved.push(`${source}:${lines.linePos(firstUnsaid).line}: and ${unresolvedCount - unresolved.length} more aliases naming no anchor, from here on`)
    }
    if (unresolved.length > 0) throw new ConfigError(unresolved)
    throw new ConfigError([`${source}:${lines.linePos(last).line}: its aliases expand to more copies than any config needs (${error.message}): write the settings out`])
  }
}

/** The largest config file read: 64 KiB, about sixteen times the shipped one with its comments. */
export const MAX_CONFIG_BYTES = 65_536

function tooLarge(source: string, bytes: number): ConfigError {
  return new ConfigError([`${source}:1: the file is ${bytes} bytes, more than a gateway config needs (at most ${MAX_CONFIG_BYTES}; config/gateway.yaml is about 4 KB): is it the right file?`])
}

/**
 * Parses and validates a config text. Every problem with a setting's shape is reported, not only
 * the first; the rules across settings (crossChecks) are checked once the shapes are right.
 */
export function parseGatewayConfig(text: string, source = DEFAULT_CONFIG_PATH): GatewayConfigFile {
  // The parser's check for keys set twice takes time with the square of a map's size, on the event
  // loop at a reload: a generated file of 20,000 entries (0.6 MB) held every request for 18 s.
  // Characters here (never more than the file's bytes: a byte that is no UTF-8 is one U+FFFD);
  // loadGatewayConfig measures the file itself before reading it.
  if (text.length > MAX_CONFIG_BYTES) throw tooLarge(source, Buffer.byteLength(text))
  const lines = new LineCounter()
  const document = parseDocument(text, { lineCounter: lines, uniqueKeys: true, prettyErrors: false })
  if (document.errors.length > 0) {
    throw new ConfigError(
      document.errors.map((error) => `${source}:${syntaxErrorLine(text, document, lines, error)}: ${syntaxErrorMessage(document, error)}`),
    )
  }
  const contents = document.contents
  if (contents === null || (isScalar(contents) && contents.value === null) || (isCollection(contents) && contents.items.length === 0)) {
    throw new ConfigError([`${source}:1: the file holds no settings (empty, or comments only): it must hold the gateway config, as config/gateway.yaml does`])
  }
  // The parser only warns of a tag it does not know (`!env NAME`), and reads the value as the text
  // after it: the file would pass, and the gateway use that text as the setting.
  const tags = document.warnings
    .filter((warning) => warning.code === 'TAG_RESOLVE_FAILED')
    .map((warning) => {
      const tag = /tag: (\S+)/.exec(warning.message)?.[1] ?? 'here'
      return (
        `${source}:${lines.linePos(warning.pos[0]).line}: the YAML tag ${tag} is not supported: write the value itself ` +
        '(a setting that has an environment variable, as README lists, is overridden by it)'
      )
    })
  if (tags.length > 0) throw new ConfigError(tags)
  const merges: string[] = []
  visit(document, {
    Pair(_key, pair) {
      if (isScalar(pair.key) && pair.key.value === '<<' && pair.key.range) {
        merges.push(`${source}:${lines.linePos(pair.key.range[0]).line}: YAML merge keys (<<) are not supported: write the settings out (anchors and aliases work)`)
      }
    },
  })
  if (merges.length > 0) throw new ConfigError(merges)
  const value = expanded(document, lines, source)
  if (!validate(value)) {
    const errors = validate.errors ?? []
    // anyOf also reports each failed branch at the same path; its own summary is the clearer one.
    const summarised = new Set(errors.filter((error) => error.keyword === 'anyOf').map((error) => error.instancePath))
    const problems = errors
      .filter((error) => error.keyword === 'anyOf' || !summarised.has(error.instancePath))
      .map(describe)
      .map(({ path, message, at = path }) => ({ line: keyLine(document, lines, at), text: `${path.join('.') || '(root)'} ${message}` }))
      .filter((problem, index, all) => all.findIndex((other) => other.text === problem.text) === index)
      .sort((a, b) => a.line - b.line)
      .map(({ line, text }) => `${source}:${line}: ${text}`)
    throw new ConfigError(problems)
  }
  const config = value as GatewayConfigFile
  const problems = crossChecks(config)
    .map(({ path, message }) => ({ line: keyLine(document, lines, path), text: `${path.join('.')} ${message}` }))
    .sort((a, b) => a.line - b.line)
    .map(({ line, text }) => `${source}:${line}: ${text}`)
  if (problems.length > 0) throw new ConfigError(problems)
  return config
}

const windowOf = (shape: { length: string; bucket: string }) => ({
  lengthMillis: durationSeconds(shape.length) * 1_000,
  bucketMillis: durationSeconds(shape.bucket) * 1_000,
})

/** Most buckets a window may have: the script walks them on every request. */
export const MAX_BUCKETS = 60

/** The Redis state keeps a bucket's length in 32 bits of milliseconds (about 49.7 days). */
const MAX_BUCKET_MILLIS = 2 ** 32 - 1

/** The longest ban step: a year, far below where a ban's end stops being a date. */
const MAX_BAN_SECONDS = 365 * 86_400

/** Rules a JSON schema cannot express. */
function crossChecks(config: GatewayConfigFile): { path: string[]; message: string }[] {
  const problems: { path: string[]; message: string }[] = []
  const buckets = { minute: 0, day: 0 }
  for (const name of ['minute', 'day'] as const) {
    const { lengthMillis, bucketMillis } = windowOf(config.windows[name])
    if (bucketMillis > MAX_BUCKET_MILLIS) {
      problems.push({ path: ['windows', name, 'bucket'], message: `must be at most ${MAX_BUCKET_MILLIS} ms (49 days)` })
    } else if (lengthMillis % bucketMillis !== 0) {
      problems.push({ path: ['windows', name, 'bucket'], message: 'must divide the window length' })
    } else if (lengthMillis / bucketMillis > MAX_BUCKETS) {
      problems.push({ path: ['windows', name, 'bucket'], message: `must leave at most ${MAX_BUCKETS} buckets in the window` })
    } else {
      buckets[name] = lengthMillis / bucketMillis
    }
  }
  if (buckets.minute > 0 && buckets.day > 0) {
    const bytes = bytesPerActiveKey(config.redis.keyPrefix, buckets.minute, buckets.day)
    if (bytes > REDIS_BYTES_PER_KEY_BUDGET) {
      problems.push({
        path: ['windows'],
        message:
          `would keep ${bytes} bytes per active key in Redis with ${buckets.minute} minute and ${buckets.day} day buckets ` +
          `and this redis.keyPrefix, over the ${REDIS_BYTES_PER_KEY_BUDGET}-byte budget: use fewer buckets`,
      })
    }
  }
  if (buckets.minute > 0 && buckets.day > 0 && windowOf(config.windows.day).lengthMillis <= windowOf(config.windows.minute).lengthMillis) {
    problems.push({ path: ['windows', 'day', 'length'], message: 'must be longer than windows.minute.length' })
  }
  for (const [index, step] of config.bans.ladder.entries()) {
    if (durationSeconds(step) > MAX_BAN_SECONDS) {
      problems.push({ path: ['bans', 'ladder', String(index)], message: 'must be at most 365d: a ban is temporary' })
    }
    // A ladder that went down passed: a client banned again within the day got a shorter ban.
    const before = config.bans.ladder[index - 1]
    if (before !== undefined && durationSeconds(step) < durationSeconds(before)) {
      problems.push({ path: ['bans', 'ladder', String(index)], message: `must be at least the step before it (${before}): each new ban within 24 h climbs the ladder` })
    }
  }
  const { host, port, opsHost, opsPort } = config.server
  for (const [name, value] of [['host', host], ['opsHost', opsHost]] as const) {
    const problem = listenHostProblem(value)
    if (problem) problems.push({ path: ['server', name], message: problem })
  }
  const urls: [string[], string, (url: string) => string | undefined][] = [
    ...Object.entries(config.upstreams).flatMap(([name, upstream]) =>
      upstream ? [[['upstreams', name, 'url'], upstream.url, upstreamUrlProblem] as [string[], string, typeof upstreamUrlProblem]] : [],
    ),
    ...Object.entries(config.openapi?.servers ?? {}).map(([name, url]) => [['openapi', 'servers', name], url, publicUrlProblem] as [string[], string, typeof publicUrlProblem]),
  ]
  for (const [path, url, problemOf] of urls) {
    const problem = problemOf(url)
    if (problem) problems.push({ path, message: problem })
  }
  if (listenersCollide({ host, port }, { host: opsHost, port: opsPort })) {
    problems.push({ path: ['server', 'opsPort'], message: 'must differ from server.port: both listeners would take one address' })
  }
  for (const [name, plan] of Object.entries(config.plans)) {
    if (typeof plan.perMinute === 'number' && typeof plan.perDay === 'number' && plan.perDay < plan.perMinute) {
      problems.push({ path: ['plans', name, 'perDay'], message: 'must be at least perMinute' })
    }
  }
  // A key's own limits replace both of its plan's (the CLI sets them together): one "custom" limit
  // beside a number means nothing for keys with limits and the fail-safe limit for keys without.
  const { perMinute, perDay } = config.plans.enterprise
  if ((perMinute === 'custom') !== (perDay === 'custom')) {
    problems.push({ path: ['plans', 'enterprise'], message: 'must have both limits "custom" or neither' })
  }
  for (const setting of ['certFile', 'keyFile'] as const) {
    const value = config.server.tls?.[setting]
    if (value !== undefined && tlsPathProblem(value)) problems.push({ path: ['server', 'tls', setting], message: tlsPathProblem(value)! })
  }
  for (const [index, entry] of (config.server.trustedProxies ?? []).entries()) {
    const problem = trustedProxyProblem(entry)
    if (problem) {
      problems.push({
        path: ['server', 'trustedProxies', String(index)],
        message: `must be an IP address, a CIDR range (10.0.0.0/8) or one of loopback, linklocal, uniquelocal (${problem})`,
      })
    }
  }
  return problems
}

/**
 * The gateway hands server.trustedProxies to Fastify's trustProxy, which compiles it with
 * @fastify/proxy-addr when the server is built: an entry it refuses would stop the gateway at
 * boot. The same compile (the version Fastify depends on) judges each entry here.
 */

function trustedProxyProblem(entry: string): string | undefined {
  try {
    proxyAddr.compile([entry])
  } catch (error) {
    return error instanceof Error ? error.message : String(error)
  }
  // proxy-addr reads IPv4 as inet_aton does: 192.168.010.005 is 192.168.8.5 (octal), 127.1 is
  // 127.0.0.1. Such an entry trusted another host than the one named, and the load balancer not.
  // `10/8` too: 0.0.0.10/8 to it, not 10.0.0.0/8. After the `/`, a netmask only when dotted.
  const [address = '', mask] = entry.split('/')
  for (const part of [address, ...(mask?.includes('.') ? [mask] : [])]) {
    if (!part.includes(':') && ipaddr.IPv4.isValid(part) && !isPlainIpv4(part)) {
      return `${part} would be read as ${ipaddr.IPv4.parse(part).toString()}: write an IPv4 address as four plain decimal numbers, without leading zeros`
    }
  }
  return undefined
}

/**
 * Applies the environment overrides documented in the README; env wins over the file. Relative
 * server.tls paths in the file are read from `configDirectory`, the config file's own folder (as
 * Prometheus reads its files); those of GATEWAY_TLS_CERT_FILE and GATEWAY_TLS_KEY_FILE from the
 * directory the process runs in, like any path given on a command line.
 */
export function resolveGatewayConfig(file: GatewayConfigFile, env: NodeJS.ProcessEnv = process.env, configDirectory = process.cwd()): GatewayConfig {
  const upstream = (entry: { url: string; timeoutSeconds?: number; maxInFlight?: number }, urlOverride?: string): UpstreamConfig => ({
    url: urlOverride || entry.url,
    timeoutMillis: Math.round((entry.timeoutSeconds ?? DEFAULT_TIMEOUT_SECONDS) * 1_000),
    maxInFlight: entry.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT,
  })
  const listeners = {
    host: listenHostFromEnv('GATEWAY_HOST', file.server.host, env),
    port: portFromEnv('GATEWAY_PORT', file.server.port, env),
    opsHost: listenHostFromEnv('GATEWAY_OPS_HOST', file.server.opsHost, env),
    opsPort: portFromEnv('GATEWAY_OPS_PORT', file.server.opsPort, env),
  }
  // The file's own pair is checked with it (crossChecks); a variable can bring them together too.
  const collision = listenersCollideProblem(
    { host: listeners.host, port: listeners.port, portName: env.GATEWAY_PORT ? 'GATEWAY_PORT' : 'server.port' },
    { host: listeners.opsHost, port: listeners.opsPort, portName: env.GATEWAY_OPS_PORT ? 'GATEWAY_OPS_PORT' : 'server.opsPort' },
  )
  if (collision) throw new EnvError(collision)
  const config: GatewayConfig = {
    server: {
      ...listeners,
      trustedProxies: file.server.trustedProxies ?? [],
      ...optional('maxConnections', maxConnectionsFromEnv('GATEWAY_MAX_CONNECTIONS', file.server.maxConnections, env)),
      maxConnectionsPerClient: file.server.maxConnectionsPerClient ?? DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
      ...optional('tls', tlsFilesFrom(file.server.tls, env, configDirectory)),
    },
    upstreams: {
      pets: upstream(file.upstreams.pets, petsUrlFromEnv(env)),
      ...(file.upstreams.orders ? { orders: upstream(file.upstreams.orders) } : {}),
    },
    keyCache: {
      maxEntries: file.keyCache.maxEntries,
      // lru-cache takes whole milliseconds only, and 16.1 * 1_000 is 16100.000000000002.
      ttlMillis: Math.round(file.keyCache.ttlSeconds * 1_000),
      negativeTtlMillis: Math.round(file.keyCache.negativeTtlSeconds * 1_000),
    },
    plans: file.plans,
    windows: {
      minute: windowOf(file.windows.minute),
      day: windowOf(file.windows.day),
    },
    anonymous: file.anonymous,
    bans: { strikes: file.bans.strikes, ladderSeconds: file.bans.ladder.map(durationSeconds) },
    onStoreFailure: file.onStoreFailure,
    redis: {
      ...(env.REDIS_URL ? { url: redisUrlFrom(env.REDIS_URL) } : {}),
      ...(env.REDIS_CLUSTER_NODES ? { clusterNodes: clusterNodesFrom(env.REDIS_CLUSTER_NODES) } : {}),
      ...redisCredentialsFrom(env),
      ...optional('clientCertificate', redisClientCertificateFrom(env)),
      commandTimeoutMillis: file.redis.commandTimeoutMillis,
      keyPrefix: file.redis.keyPrefix,
    },
    openapi: { servers: { ...(file.openapi?.servers ?? DEFAULT_API_SERVERS) } },
  }
  return deepFreeze(config)
}

/** `{ [name]: value }`, or nothing for undefined: the frozen config carries no key set to undefined. */
function optional<K extends string, V>(name: K, value: V | undefined): Partial<Record<K, V>> {
  return value === undefined ? {} : ({ [name]: value } as Record<K, V>)
}

/**
 * server.tls with GATEWAY_TLS_CERT_FILE and GATEWAY_TLS_KEY_FILE over it, as absolute paths. Each
 * variable replaces its own setting; what results must name both files or neither: a certificate
 * without its key (or the other way round) cannot be served, and plain HTTP instead would be a
 * silent downgrade.
 */
function tlsFilesFrom(file: GatewayConfigFile['server']['tls'], env: NodeJS.ProcessEnv, configDirectory: string): TlsFiles | undefined {
  for (const variable of Object.values(TLS_VARIABLES)) {
    const problem = env[variable] ? tlsPathProblem(env[variable]) : undefined
    if (problem) throw new EnvError(`${variable} ${problem}`)
  }
  const certFile = env.GATEWAY_TLS_CERT_FILE ? resolve(env.GATEWAY_TLS_CERT_FILE) : file && resolve(configDirectory, file.certFile)
  const keyFile = env.GATEWAY_TLS_KEY_FILE ? resolve(env.GATEWAY_TLS_KEY_FILE) : file && resolve(configDirectory, file.keyFile)
  if (certFile === undefined && keyFile === undefined) return undefined
  if (certFile === undefined || keyFile === undefined) {
    const [given, missing] = certFile === undefined ? ['GATEWAY_TLS_KEY_FILE', 'GATEWAY_TLS_CERT_FILE'] : ['GATEWAY_TLS_CERT_FILE', 'GATEWAY_TLS_KEY_FILE']
    throw new EnvError(`${given} is set without ${missing}, and the config has no server.tls: HTTPS needs both the certificate and its key`)
  }
  return { certFile, keyFile }
}

/**
 * server.tls's settings and their variables name files. PEM text given in their place (a key
 * pasted inline, an env var filled from a secret's contents) would be taken for a path, and the
 * "cannot be read" message would print it, private key and all, in the fatal log line: such a
 * value is refused without being shown.
 */
function tlsPathProblem(value: string): string | undefined {
  return /-----BEGIN|[\r\n]/.test(value)
    ? 'holds PEM text (or several lines), not a path: name the file that holds it (the value is not shown)'
    : undefined
}

/** Which environment variable overrides each server.tls setting. */
const TLS_VARIABLES = { certFile: 'GATEWAY_TLS_CERT_FILE', keyFile: 'GATEWAY_TLS_KEY_FILE' } as const

/**
 * Reads the pair server.tls names and says what is wrong with it, naming the setting (its line in
 * the file, or the variable that set it) and the file. Done at start and by check-config; a
 * rotation checks the files again (tlsRotation.ts) and keeps the pair in force if they fail.
 */
function checkTlsFiles(config: GatewayConfig, text: string, source: string, env: NodeJS.ProcessEnv): void {
  const files = config.server.tls
  if (!files) return
  try {
    readTlsPair(files)
  } catch (error) {
    if (!(error instanceof TlsFilesError)) throw error
    const settings = error.setting === 'both' ? (['certFile', 'keyFile'] as const) : [error.setting]
    const fromEnv = settings.filter((setting) => env[TLS_VARIABLES[setting]])
    if (fromEnv.length > 0) throw new EnvError(`${fromEnv.map((setting) => TLS_VARIABLES[setting]).join(' or ')}: ${error.message}`)
    const path = ['server', 'tls', ...(error.setting === 'both' ? [] : [error.setting])]
    const lines = new LineCounter()
    const document = parseDocument(text, { lineCounter: lines })
    throw new ConfigError([`${source}:${keyLine(document, lines, path)}: ${path.join('.')} ${error.message}`])
  }
}

/** The variables naming the certificate the gateway presents to Redis, per setting. */
const REDIS_TLS_VARIABLES = { certFile: 'REDIS_TLS_CERT_FILE', keyFile: 'REDIS_TLS_KEY_FILE' } as const

/**
 * REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE, as absolute paths (relative ones from the directory
 * the process runs in). Both or neither; and only beside a Redis reached over TLS, since no other
 * connection could present them: given for a `redis://` URL they would be ignored while the
 * operator believes the connection authenticated.
 */
function redisClientCertificateFrom(env: NodeJS.ProcessEnv): TlsFiles | undefined {
  for (const variable of Object.values(REDIS_TLS_VARIABLES)) {
    const problem = env[variable] ? tlsPathProblem(env[variable]) : undefined
    if (problem) throw new EnvError(`${variable} ${problem}`)
  }
  const certFile = env.REDIS_TLS_CERT_FILE || undefined
  const keyFile = env.REDIS_TLS_KEY_FILE || undefined
  if (certFile === undefined && keyFile === undefined) return undefined
  if (certFile === undefined || keyFile === undefined) {
    const [given, missing] = certFile === undefined ? ['REDIS_TLS_KEY_FILE', 'REDIS_TLS_CERT_FILE'] : ['REDIS_TLS_CERT_FILE', 'REDIS_TLS_KEY_FILE']
    throw new EnvError(`${given} is set without ${missing}: a client certificate for Redis needs both the certificate and its key`)
  }
  // The seeds first: beside a REDIS_URL, the cluster is what the gateway connects to (connectRedis).
  const seeds = (env.REDIS_CLUSTER_NODES ?? '').split(',').map((node) => node.trim()).filter(Boolean)
  const overTls = seeds.length > 0 ? clusterUsesTls(seeds) : env.REDIS_URL ? /^rediss:\/\//i.test(env.REDIS_URL) : false
  if (!overTls) {
    throw new EnvError(
      'REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE are set but no Redis is reached over TLS (a rediss:// REDIS_URL, or rediss:// seeds in REDIS_CLUSTER_NODES): no connection would present the certificate',
    )
  }
  return { certFile: resolve(certFile), keyFile: resolve(keyFile) }
}

/**
 * Reads the pair REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE name and says what is wrong with it,
 * naming the variable: at start, rather than at each connection's handshake, where Redis would
 * only say that the client sent no certificate it accepts.
 */
function checkRedisClientCertificate(config: GatewayConfig): void {
  const files = config.redis.clientCertificate
  if (!files) return
  try {
    readTlsPair(files)
  } catch (error) {
    if (!(error instanceof TlsFilesError)) throw error
    const variables = error.setting === 'both' ? 'REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE' : REDIS_TLS_VARIABLES[error.setting]
    throw new EnvError(`${variables}: ${error.message}`)
  }
}

function petsUrlFromEnv(env: NodeJS.ProcessEnv): string | undefined {
  const raw = env.PETS_URL
  const problem = raw ? upstreamUrlProblem(raw) : undefined
  // An upstream behind basic authentication carries its password in the URL: echoed without it.
  if (problem) throw new EnvError(`PETS_URL ${problem} (got "${withoutPassword(raw!)}")`)
  return raw || undefined
}

/**
 * REDIS_URL: `redis://` or `rediss://`, or what ioredis also takes: `host:port`, a bare port, a
 * Unix socket's path. Anything else (another scheme, a word) would leave the client reconnecting
 * to nowhere while the gateway runs on its fallback for good.
 */
function redisUrlFrom(raw: string): string {
  if ((raw.startsWith('/') && !raw.startsWith('//')) || /^\d{1,5}$/.test(raw) || clusterSeed(raw)) return raw
  const scheme = urlScheme(raw)
  // The URL parser forgives what ioredis does not: a space before the scheme (ioredis threw at
  // start, a stack trace), `rediss:/host` (taken for a socket's path, without TLS).
  if ((scheme !== 'redis:' && scheme !== 'rediss:') || !/^rediss?:\/\//i.test(raw)) {
    throw new EnvError(`REDIS_URL must be a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379, or host:port (got "${withoutPassword(raw)}")`)
  }
  // ioredis takes TLS from a lower-case `rediss://` only: `REDISS://` reached the server over plain
  // TCP, the password included.
  return scheme + raw.slice(scheme.length)
}

/** `user:password@` at the start of a value (after a scheme, if any), up to its last `@`: a password may hold one unencoded. */
const USERINFO_PASSWORD = /^((?:[A-Za-z][A-Za-z0-9+.-]*:)?(?:\/\/)?[^:/@]*):.*@/

/**
 * A refused REDIS_URL or seed as the start-up error may print it: the value is echoed so the
 * operator sees what was read, but a password in it (`tls://default:secret@…`, `user:secret@host:port`)
 * would go to the log and the terminal with it.
 */
function withoutPassword(value: string): string {
  return value.replace(USERINFO_PASSWORD, '$1:***@').replace(QUERY_PASSWORD, '$1***')
}

/** `password=` in a value's query (`redis://host:6379?password=secret`, which ioredis takes too), up to the next `&` or `#`. */
const QUERY_PASSWORD = /([?&]password=)[^&#]*/gi

/**
 * Whether a REDIS_URL names a user or a password itself (`redis://:secret@host`, `rediss://user:secret@host`),
 * in its query too (`redis://host?password=secret`, `/run/redis.sock?password=secret`): ioredis reads
 * its options there, and lets them win over REDIS_PASSWORD as it does the URL's user and password.
 */
function urlHasCredentials(raw: string): boolean {
  const query = raw.includes('?') ? new URLSearchParams(raw.slice(raw.indexOf('?') + 1).split('#')[0]) : undefined
  if (query?.has('username') || query?.has('password')) return true
  if (!urlScheme(raw)) return false
  const url = new URL(raw)
  return url.username !== '' || url.password !== ''
}

/**
 * REDIS_USERNAME and REDIS_PASSWORD: the only way to give REDIS_CLUSTER_NODES a password (a seed is
 * host:port), and usable with a REDIS_URL that names none (no percent-encoding needed then). A
 * REDIS_URL with its own credentials beside them is refused: one of the two would be silently
 * ignored (ioredis lets the URL's win). A user needs a password (ACL `nopass` users take any),
 * and credentials with no Redis to give them to are a mistake too: the gateway would run on its
 * in-process store, each replica alone. Messages name the variables, never their values.
 */
function redisCredentialsFrom(env: NodeJS.ProcessEnv): { username?: string; password?: string } {
  const username = env.REDIS_USERNAME || undefined
  const password = env.REDIS_PASSWORD || undefined
  if (username === undefined && password === undefined) return {}
  const both = username !== undefined && password !== undefined
  const given = both ? 'REDIS_USERNAME and REDIS_PASSWORD are' : username !== undefined ? 'REDIS_USERNAME is' : 'REDIS_PASSWORD is'
  if (!env.REDIS_URL && !env.REDIS_CLUSTER_NODES) {
    throw new EnvError(`${given} set but neither REDIS_URL nor REDIS_CLUSTER_NODES is: no Redis would use ${both ? 'them' : 'it'}`)
  }
  if (env.REDIS_URL && urlHasCredentials(env.REDIS_URL)) {
    throw new EnvError(
      `REDIS_URL has its own user or password and ${given} set too: ` +
        `give them one way only, in REDIS_URL or in REDIS_USERNAME and REDIS_PASSWORD (got "${withoutPassword(env.REDIS_URL)}")`,
    )
  }
  if (password === undefined) {
    throw new EnvError('REDIS_USERNAME is set without REDIS_PASSWORD: an ACL user logs in with a password (any, for a nopass user)')
  }
  return { ...optional('username', username), password }
}

const CLUSTER_SEED = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+)):(\d{1,5})$/

/** The prefix of a REDIS_CLUSTER_NODES seed reached over TLS. */
const TLS_SEED = 'rediss://'

/** A Redis Cluster seed, `host:port`, `[v6]:port` or either after `rediss://`, as host and port; undefined for anything else. */
export function clusterSeed(node: string): { host: string; port: number } | undefined {
  const match = CLUSTER_SEED.exec(node.startsWith(TLS_SEED) ? node.slice(TLS_SEED.length) : node)
  const port = Number(match?.[3] ?? 0)
  return match && port >= 1 && port <= 65_535 ? { host: (match[1] ?? match[2]) as string, port } : undefined
}

/** Whether a cluster's seeds (clusterNodesFrom has checked they agree) say TLS: every node is then reached over it. */
export function clusterUsesTls(nodes: readonly string[]): boolean {
  return nodes.length > 0 && nodes.every((node) => node.startsWith(TLS_SEED))
}

/**
 * REDIS_CLUSTER_NODES: `host:port` seeds separated by commas (`[::1]:7000` for IPv6), each after
 * `rediss://` for a cluster that takes TLS. A URL, the form REDIS_URL takes, would otherwise be
 * split into host "redis" and no port, and the gateway would run on its fallback for good with
 * nothing but "not reachable" to show for it. TLS is the whole cluster's or none of it (the
 * client reaches every node it finds the same way): seeds that disagree are refused, or some
 * would be tried in a way the cluster cannot answer.
 */
function clusterNodesFrom(raw: string): string[] {
  const nodes = raw.split(',').map((node) => node.trim()).filter(Boolean)
  for (const node of nodes) {
    if (!clusterSeed(node)) {
      throw new EnvError(
        `REDIS_CLUSTER_NODES must list host:port seeds separated by commas ([::1]:7000 for IPv6), each after rediss:// for TLS, got "${withoutPassword(node)}"`,
      )
    }
  }
  const overTls = nodes.filter((node) => node.startsWith(TLS_SEED))
  if (overTls.length > 0 && overTls.length < nodes.length) {
    throw new EnvError(
      `REDIS_CLUSTER_NODES mixes rediss:// seeds with plain host:port ones: every node of a cluster is reached the same way, so give rediss:// to all of them or to none`,
    )
  }
  return nodes
}

/**
 * Reads and validates a config file; a relative `path` is read from `directory` and named as given.
 * An unreadable relative path names the directory it was looked for in: npm runs every script from
 * the package's directory, wherever the command was typed.
 */
export function loadGatewayConfig(
  path = process.env.GATEWAY_CONFIG || DEFAULT_CONFIG_PATH,
  env = process.env,
  directory = process.cwd(),
  /**
   * tlsFiles false: server.tls's and Redis's certificate files are not read (a config reload: their
   * rotation is checked on its own), unless server.tls names other files than `tlsInForce`: the
   * next start reads those, and would not start on files it cannot read.
   */
  options: { tlsFiles?: boolean; tlsInForce?: TlsFiles } = {},
): GatewayConfig {
  let text: string
  try {
    // Its size first, on the file opened (a rename between a look and the read cannot swap it): a
    // large file (the wrong one named) is refused without reading it all.
    const file = openSync(resolve(directory, path), 'r')
    try {
      const stats = fstatSync(file)
      if (stats.isDirectory()) throw Object.assign(new Error('is a directory'), { code: 'EISDIR' })
      if (stats.isFile() && stats.size > MAX_CONFIG_BYTES) throw tooLarge(path, stats.size)
      text = readFileSync(file, 'utf8')
    } finally {
      closeSync(file)
    }
  } catch (error) {
    if (error instanceof ConfigError) throw error
    const where = isAbsolute(path) ? '' : `, looked for in ${directory}`
    throw new ConfigError([`${path}: cannot be read (${(error as NodeJS.ErrnoException).code ?? 'error'}${where})`])
  }
  const config = resolveGatewayConfig(parseGatewayConfig(text, path), env, dirname(resolve(directory, path)))
  if (options.tlsFiles !== false) {
    checkTlsFiles(config, text, path, env)
    checkRedisClientCertificate(config)
  } else if ('tlsInForce' in options && JSON.stringify(config.server.tls) !== JSON.stringify(options.tlsInForce)) {
    // Only a reload says which files are in force: the keys CLI (no tlsInForce) reads none of them.
    checkTlsFiles(config, text, path, env)
  }
  return config
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object') {
    Object.values(value).forEach(deepFreeze)
    Object.freeze(value)
  }
  return value
}

/**
 * Why `url` cannot be an OpenAPI server's, or undefined: the document is served to anyone, without
 * a key, so a `user:password` in it was published.
 */
function publicUrlProblem(url: string): string | undefined {
  const problem = httpUrlProblem(url)
  if (problem) return problem
  const { username, password } = new URL(url)
  return username || password ? 'must hold no user:password: /v1/openapi.json, which names it, is served to anyone' : undefined
}
