import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import Fastify from 'fastify'
import { pino } from 'pino'
import { afterEach, describe, expect, it } from 'vitest'
import { createConfigSource } from '../../gateway/src/config/configSource.ts'
import {
  ConfigError,
  clusterSeed,
  clusterUsesTls,
  loadGatewayConfig,
  parseGatewayConfig,
  resolveGatewayConfig,
} from '../../gateway/src/config/loadConfig.ts'
import { createKeyCache } from '../../gateway/src/keys/keyCache.ts'
import { keyLimit, limitsFor } from '../../gateway/src/rateLimit/planLimits.ts'

const SHIPPED = readFileSync('config/gateway.yaml', 'utf8')
const FREE_LINE = /^ {2}free: .*\n/m

/** The line of the shipped config that starts (after its indent) with `start`, counted from 1. */
function shippedLine(start: string): number {
  const index = SHIPPED.split('\n').findIndex((line) => line.trimStart().startsWith(start))
  expect(index, `a line of config/gateway.yaml starting ${start}`).toBeGreaterThanOrEqual(0)
  return index + 1
}

/** The shipped config with one edit; fails the test if the edit matched nothing. */
function shippedWith(from: string | RegExp, to: string | ((match: string) => string)): string {
  const text = typeof to === 'string' ? SHIPPED.replace(from, to) : SHIPPED.replace(from, to)
  expect(text).not.toBe(SHIPPED)
  return text
}

/** The message resolving `file` with `env` is refused with ('' when it is not). */
function refusalOf(file: Parameters<typeof resolveGatewayConfig>[0], env: NodeJS.ProcessEnv): string {
  try {
    resolveGatewayConfig(file, env)
    return ''
  } catch (error) {
    return (error as Error).message
  }
}

function problemsOf(fixture: string): string[] {
  const path = `test/fixtures/config/${fixture}`
  try {
    parseGatewayConfig(readFileSync(path, 'utf8'), path)
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError)
    return (error as ConfigError).problems
  }
  throw new Error(`${fixture} was accepted`)
}

describe('gateway config', () => {
  it('loads the shipped config/gateway.yaml with the spec plans', () => {
    const config = loadGatewayConfig('config/gateway.yaml', {})
    expect(config.plans).toEqual({
      free: { perMinute: 60, perDay: 1000 },
      pro: { perMinute: 300, perDay: 10000 },
      business: { perMinute: 1000, perDay: 100000 },
      enterprise: { perMinute: 'custom', perDay: 'custom' },
    })
    expect(config.bans.ladderSeconds).toEqual([60, 300, 900, 3600, 86400])
    expect(config.upstreams.pets).toEqual({ url: 'http://127.0.0.1:3001', timeoutMillis: 10_000, maxInFlight: 1_024 })
    expect(config.windows).toEqual({
      minute: { lengthMillis: 60_000, bucketMillis: 5_000 },
      day: { lengthMillis: 86_400_000, bucketMillis: 3_600_000 },
    })
    expect(config.redis).toEqual({ commandTimeoutMillis: 50, keyPrefix: '' })
    expect(Object.isFrozen(config.plans.free)).toBe(true)
  })

  it('lets the environment override listeners and the upstream', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    const config = resolveGatewayConfig(file, { GATEWAY_PORT: '18080', GATEWAY_HOST: '127.0.0.1', GATEWAY_OPS_PORT: '19464', PETS_URL: 'http://pets:3001' })
    expect(config.server).toMatchObject({ host: '127.0.0.1', port: 18080, opsPort: 19464 })
    expect(config.upstreams.pets.url).toBe('http://pets:3001')
    // The shipped file leaves the connection cap to be derived from the open-file limit at start.
    expect(config.server.maxConnections).toBeUndefined()
    file.server.maxConnections = 5_000
    expect(resolveGatewayConfig(file, {}).server.maxConnections).toBe(5_000)
    expect(resolveGatewayConfig(file, { GATEWAY_MAX_CONNECTIONS: '800' }).server.maxConnections).toBe(800)
    expect(() => resolveGatewayConfig(file, { GATEWAY_MAX_CONNECTIONS: '0' })).toThrow(
      'GATEWAY_MAX_CONNECTIONS must be a whole number of connections from 1 to 1000000, got "0"',
    )
    delete file.server.maxConnections
    const clustered = resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: 'redis-a:7000, redis-b:7000', REDIS_URL: 'redis://r:6379' })
    expect(clustered.redis).toMatchObject({ url: 'redis://r:6379', clusterNodes: ['redis-a:7000', 'redis-b:7000'] })
    expect(() => resolveGatewayConfig(file, { GATEWAY_PORT: 'eighty' })).toThrow(/GATEWAY_PORT/)
    expect(() => resolveGatewayConfig(file, { GATEWAY_HOST: '0.0.0.0:8080' })).toThrow(/^GATEWAY_HOST must be an IP address or a host name/)
    expect(() => resolveGatewayConfig(file, { GATEWAY_OPS_HOST: '[::1]' })).toThrow(/^GATEWAY_OPS_HOST must be an IP address or a host name/)
    expect(() => resolveGatewayConfig(file, { REDIS_URL: 'garbage' })).toThrow(
      'REDIS_URL must be a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379, or host:port (got "garbage")',
    )
    // The URL parser takes a space before the scheme and a missing //; ioredis threw at start on
    // the space and on redis:host:port, and took rediss:/host:port for a socket's path, without TLS.
    for (const wrong of ['http://redis:6379', 'redis-primary', 'redis-primary:port', ' redis://redis:6379', '\tREDISS://redis:6380', 'rediss:/redis:6380', 'redis:redis:6379']) {
      expect(() => resolveGatewayConfig(file, { REDIS_URL: wrong }), wrong).toThrow(/^REDIS_URL must be a redis:\/\//)
    }
    // What ioredis takes besides a URL: host:port, [v6]:port, a bare port, a socket's path.
    for (const url of ['redis://redis:6379', 'rediss://user:secret@redis.example.com:6380/2', '/run/redis.sock', '127.0.0.1:6379', 'redis-primary:6379', '[::1]:6379', '6379']) {
      expect(resolveGatewayConfig(file, { REDIS_URL: url }).redis.url).toBe(url)
    }
    // ioredis takes TLS from a lower-case rediss:// only; REDISS:// went over plain TCP.
    expect(resolveGatewayConfig(file, { REDIS_URL: 'REDISS://:S3cr3t@redis.example.com:6380' }).redis.url).toBe('rediss://:S3cr3t@redis.example.com:6380')
    expect(() => resolveGatewayConfig(file, { PETS_URL: 'http://pets:99999' })).toThrow(
      'PETS_URL must be a valid http:// or https:// URL (is the port 1-65535? is every [ closed?) (got "http://pets:99999")',
    )
  })

  // check-config refuses server.opsPort equal to server.port; the same through the variables
  // passed, and the gateway died at start on EADDRINUSE with a stack trace naming no variable.
  it('refuses GATEWAY_OPS_PORT or GATEWAY_PORT that puts both listeners on one address, naming the variables', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    expect(() => resolveGatewayConfig(file, { GATEWAY_OPS_PORT: '8080' })).toThrow(
      'GATEWAY_OPS_PORT must differ from server.port (both 8080): the ops and public listeners would take one address',
    )
    expect(() => resolveGatewayConfig(file, { GATEWAY_PORT: '9464' })).toThrow(/^server\.opsPort must differ from GATEWAY_PORT \(both 9464\)/)
    expect(() => resolveGatewayConfig(file, { GATEWAY_PORT: '7000', GATEWAY_OPS_PORT: '7000' })).toThrow(/^GATEWAY_OPS_PORT must differ from GATEWAY_PORT/)
    expect(resolveGatewayConfig(file, { GATEWAY_PORT: '7000', GATEWAY_OPS_PORT: '7000', GATEWAY_HOST: '127.0.0.1', GATEWAY_OPS_HOST: '127.0.0.2' }).server.opsPort).toBe(7000)
    expect(resolveGatewayConfig(file, { GATEWAY_PORT: '0', GATEWAY_OPS_PORT: '0' }).server.port).toBe(0)
  })

  it('takes REDIS_CLUSTER_NODES as host:port seeds, IPv6 in brackets, and refuses anything else by name', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    const seeds = resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: '10.0.0.5:7000,[::1]:7001, redis-c.internal:7002 ' })
    expect(seeds.redis.clusterNodes).toEqual(['10.0.0.5:7000', '[::1]:7001', 'redis-c.internal:7002'])
    expect(seeds.redis.clusterNodes!.map(clusterSeed)).toEqual([
      { host: '10.0.0.5', port: 7000 },
      { host: '::1', port: 7001 },
      { host: 'redis-c.internal', port: 7002 },
    ])
    expect(clusterUsesTls(seeds.redis.clusterNodes!)).toBe(false)
    for (const wrong of ['redis://127.0.0.1:7000', '127.0.0.1', '::1:7000', 'redis-a:0', 'redis-a:70000', 'redis-a:port', 'rediss://redis-a', 'rediss://redis-a:7000/0']) {
      expect(() => resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: `redis-b:7000,${wrong}` }), wrong).toThrow(
        `REDIS_CLUSTER_NODES must list host:port seeds separated by commas ([::1]:7000 for IPv6), each after rediss:// for TLS, got "${wrong}"`,
      )
    }
  })

  // README, Managed Postgres and Redis: TLS to a Redis Cluster.
  it('takes REDIS_CLUSTER_NODES seeds after rediss:// for TLS, all of them or none', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    const overTls = resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: 'rediss://clustercfg.example.com:6379, rediss://[::1]:7001' })
    expect(overTls.redis.clusterNodes).toEqual(['rediss://clustercfg.example.com:6379', 'rediss://[::1]:7001'])
    expect(overTls.redis.clusterNodes!.map(clusterSeed)).toEqual([
      { host: 'clustercfg.example.com', port: 6379 },
      { host: '::1', port: 7001 },
    ])
    expect(clusterUsesTls(overTls.redis.clusterNodes!)).toBe(true)
    expect(() => resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: 'rediss://redis-a:7000,redis-b:7000' })).toThrow(
      'REDIS_CLUSTER_NODES mixes rediss:// seeds with plain host:port ones: every node of a cluster is reached the same way, so give rediss:// to all of them or to none',
    )
  })

  // A refused value is echoed so the operator sees what was read; its password must not be.
  it('never prints the password of a refused REDIS_URL, REDIS_CLUSTER_NODES entry or PETS_URL', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    const refusals: [Record<string, string>, string][] = [
      [{ REDIS_URL: 'tls://default:S3cr3t-pa55@redis.example.com:6380' }, 'got "tls://default:***@redis.example.com:6380"'],
      [{ REDIS_URL: 'valkey://:S3cr3t-pa55@redis:6379/2' }, 'got "valkey://:***@redis:6379/2"'],
      [{ REDIS_URL: 'http://u:S3cr3t@pa55@redis:6379' }, 'got "http://u:***@redis:6379"'],
      [{ REDIS_CLUSTER_NODES: 'redis-a:7000,gw:S3cr3t-pa55@redis-b:7000' }, 'got "gw:***@redis-b:7000"'],
      [{ REDIS_CLUSTER_NODES: 'redis://gw:S3cr3t-pa55@redis-b:7000' }, 'got "redis://gw:***@redis-b:7000"'],
      [{ REDIS_CLUSTER_NODES: 'rediss://gw:S3cr3t-pa55@redis-b:7000' }, 'got "rediss://gw:***@redis-b:7000"'],
      // ioredis takes a password from the query too.
      [{ REDIS_URL: 'tls://redis.example.com:6380?password=S3cr3t-pa55&db=2' }, 'got "tls://redis.example.com:6380?password=***&db=2"'],
      [{ REDIS_URL: 'redis.example.com:6380?Password=S3cr3t-pa55' }, 'got "redis.example.com:6380?Password=***"'],
      // An upstream behind basic authentication, its port mistyped.
      [{ PETS_URL: 'http://gw:S3cr3t-pa55@pets:99999' }, 'got "http://gw:***@pets:99999"'],
      [{ PETS_URL: 'ftp://gw:S3cr3t-pa55@pets:3001' }, 'got "ftp://gw:***@pets:3001"'],
      [{ PETS_URL: 'http://gw:S3cr3t-pa55@pets:3001' }, 'origin only (scheme, host, port): the gateway sends no path, query or user:password of it (got "http://gw:***@pets:3001")'],
    ]
    for (const [env, shown] of refusals) {
      const message = refusalOf(file, env)
      expect(message, JSON.stringify(env)).toContain(shown)
      expect(message).not.toContain('S3cr3t')
      expect(message).not.toContain('pa55')
    }
  })

  // README, Managed Postgres and Redis: REDIS_CLUSTER_NODES takes its password from REDIS_PASSWORD
  // (a seed is host:port); a REDIS_URL carries its own, and may not be given one both ways.
  it('takes REDIS_USERNAME and REDIS_PASSWORD for the Cluster and a REDIS_URL without credentials, and refuses them beside a URL that has its own', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    const seeds = 'redis-a:7000,redis-b:7000'
    expect(resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: seeds, REDIS_PASSWORD: 'p@ss:w/rd#1' }).redis).toMatchObject({
      clusterNodes: ['redis-a:7000', 'redis-b:7000'],
      password: 'p@ss:w/rd#1',
    })
    expect(resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: seeds, REDIS_PASSWORD: 'p@ss:w/rd#1' }).redis).not.toHaveProperty('username')
    expect(resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: seeds, REDIS_USERNAME: 'gateway', REDIS_PASSWORD: 'pw' }).redis).toMatchObject({
      username: 'gateway',
      password: 'pw',
    })
    for (const url of ['redis://redis:6379/2', 'rediss://redis.example.com:6380', 'redis:6379', '/run/redis.sock']) {
      expect(resolveGatewayConfig(file, { REDIS_URL: url, REDIS_PASSWORD: 'pw' }).redis, url).toMatchObject({ url, password: 'pw' })
    }
    // Empty is unset, as for REDIS_URL.
    expect(resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: seeds, REDIS_USERNAME: '', REDIS_PASSWORD: '' }).redis).not.toHaveProperty('password')
    const refusals: [Record<string, string>, string][] = [
      [
        { REDIS_URL: 'redis://:S3cr3t-pa55@redis:6379', REDIS_PASSWORD: 'S3cr3t-pa55' },
        'REDIS_URL has its own user or password and REDIS_PASSWORD is set too: give them one way only, in REDIS_URL or in REDIS_USERNAME and REDIS_PASSWORD (got "redis://:***@redis:6379")',
      ],
      [
        { REDIS_URL: 'rediss://gw:S3cr3t-pa55@redis:6380', REDIS_CLUSTER_NODES: seeds, REDIS_USERNAME: 'gw', REDIS_PASSWORD: 'S3cr3t-pa55' },
        'REDIS_URL has its own user or password and REDIS_USERNAME and REDIS_PASSWORD are set too',
      ],
      // ioredis would keep the URL's user and its empty password, and drop REDIS_PASSWORD.
      [{ REDIS_URL: 'redis://gw@redis:6379', REDIS_PASSWORD: 'S3cr3t-pa55' }, 'REDIS_URL has its own user or password and REDIS_PASSWORD is set too'],
      // ioredis reads its options from the query as well, and the URL's win: REDIS_PASSWORD was dropped (WRONGPASS).
      [
        { REDIS_URL: 'redis://redis:6379?password=S3cr3t-pa55', REDIS_PASSWORD: 'S3cr3t-pa55' },
        'REDIS_URL has its own user or password and REDIS_PASSWORD is set too: give them one way only, in REDIS_URL or in REDIS_USERNAME and REDIS_PASSWORD (got "redis://redis:6379?password=***")',
      ],
      [{ REDIS_URL: '/run/redis.sock?db=1&password=S3cr3t-pa55', REDIS_PASSWORD: 'S3cr3t-pa55' }, 'REDIS_URL has its own user or password and REDIS_PASSWORD is set too'],
      [{ REDIS_URL: 'rediss://redis:6380/?username=gw', REDIS_USERNAME: 'gw', REDIS_PASSWORD: 'S3cr3t-pa55' }, 'REDIS_URL has its own user or password and REDIS_USERNAME and REDIS_PASSWORD are set too'],
      [{ REDIS_CLUSTER_NODES: seeds, REDIS_USERNAME: 'gw' }, 'REDIS_USERNAME is set without REDIS_PASSWORD'],
      [{ REDIS_PASSWORD: 'S3cr3t-pa55' }, 'REDIS_PASSWORD is set but neither REDIS_URL nor REDIS_CLUSTER_NODES is: no Redis would use it'],
    ]
    for (const [env, shown] of refusals) {
      const message = refusalOf(file, env)
      expect(message, JSON.stringify(env)).toContain(shown)
      expect(message).not.toContain('S3cr3t')
    }
  })

  // README: an upstream answers 504 after timeoutSeconds (10 s) and refuses past maxInFlight (1,024).
  it('gives an upstream that leaves out its timeout and bound the documented 10 s and 1,024, and PETS_URL moves only the pets upstream', () => {
    const file = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))
    file.upstreams.pets = { url: file.upstreams.pets.url }
    file.upstreams.orders = { url: 'http://orders:3002' }
    const config = resolveGatewayConfig(file, { PETS_URL: 'http://pets:3001' })
    expect(config.upstreams.pets).toEqual({ url: 'http://pets:3001', timeoutMillis: 10_000, maxInFlight: 1_024 })
    expect(config.upstreams.orders).toEqual({ url: 'http://orders:3002', timeoutMillis: 10_000, maxInFlight: 1_024 })
  })

  it('names the line and key of an unknown key', () => {
    expect(problemsOf('unknown-key.yaml')).toEqual(['test/fixtures/config/unknown-key.yaml:6: plans.free.perHour unknown key'])
  })

  it('reports every bad value with its line', () => {
    expect(problemsOf('bad-values.yaml')).toEqual([
      'test/fixtures/config/bad-values.yaml:1: server.port must be <= 65535',
      'test/fixtures/config/bad-values.yaml:1: server.maxConnections must be >= 1',
      'test/fixtures/config/bad-values.yaml:3: upstreams.pets.url must be an http:// or https:// URL',
      'test/fixtures/config/bad-values.yaml:3: upstreams.pets.timeoutSeconds must be >= 0.001',
      'test/fixtures/config/bad-values.yaml:4: keyCache.ttlSeconds must be >= 0.001',
      'test/fixtures/config/bad-values.yaml:6: plans.free.perMinute must be a positive integer (only the enterprise plan may be "custom")',
      'test/fixtures/config/bad-values.yaml:10: anonymous.perMinute must be >= 1',
      'test/fixtures/config/bad-values.yaml:11: bans.ladder.1 must be a duration like 60s, 5m, 1h, 24h',
      'test/fixtures/config/bad-values.yaml:12: onStoreFailure must be one of open, closed',
    ])
  })

  it('refuses window buckets that do not divide the window or would cost too much memory', () => {
    expect(problemsOf('bad-window.yaml')).toEqual([
      'test/fixtures/config/bad-window.yaml:11: windows.minute.bucket must divide the window length',
      'test/fixtures/config/bad-window.yaml:12: windows.day.bucket must leave at most 60 buckets in the window',
    ])
  })

  it('refuses windows whose state would take more than 400 bytes per active key in Redis, counting the key prefix', () => {
    expect(problemsOf('bad-window-memory.yaml')).toEqual([
      'test/fixtures/config/bad-window-memory.yaml:10: windows would keep 552 bytes per active key in Redis with 30 minute and 24 day buckets ' +
        'and this redis.keyPrefix, over the 400-byte budget: use fewer buckets',
    ])
  })

  it('refuses a bucket longer than the Redis state can hold (2^32 ms)', () => {
    expect(problemsOf('bad-window-bucket.yaml')).toEqual([
      'test/fixtures/config/bad-window-bucket.yaml:12: windows.day.bucket must be at most 4294967295 ms (49 days)',
    ])
  })

  it('refuses settings that pass one by one but not together: a day window no longer than the minute, a ban of over a year, one port for both listeners', () => {
    expect(problemsOf('bad-settings-together.yaml')).toEqual([
      'test/fixtures/config/bad-settings-together.yaml:1: server.opsPort must differ from server.port: both listeners would take one address',
      'test/fixtures/config/bad-settings-together.yaml:12: windows.day.length must be longer than windows.minute.length',
      'test/fixtures/config/bad-settings-together.yaml:14: bans.ladder.1 must be at most 365d: a ban is temporary',
      'test/fixtures/config/bad-settings-together.yaml:14: bans.ladder.2 must be at least the step before it (366d): each new ban within 24 h climbs the ladder',
    ])
  })

  it('starts with every key-cache lifetime it accepts: one that is no whole number of milliseconds is rounded to one', () => {
    for (const seconds of [16.1, 1.001, 0.001]) {
      const text = shippedWith('ttlSeconds: 60 ', `ttlSeconds: ${seconds} `).replace('negativeTtlSeconds: 10 ', `negativeTtlSeconds: ${seconds} `)
      const config = resolveGatewayConfig(parseGatewayConfig(text), {})
      expect([config.keyCache.ttlMillis, config.keyCache.negativeTtlMillis]).toEqual([Math.round(seconds * 1_000), Math.round(seconds * 1_000)])
      expect(() => createKeyCache({ findByHash: async () => undefined }, config.keyCache)).not.toThrow()
    }
  })

  it('names a missing section', () => {
    expect(problemsOf('missing-section.yaml')).toEqual(['test/fixtures/config/missing-section.yaml:1: plans is required'])
  })

  it('reports YAML syntax errors and duplicate keys with their line', () => {
    expect(problemsOf('not-yaml.yaml')[0]).toMatch(/^test\/fixtures\/config\/not-yaml\.yaml:\d+: /)
    expect(problemsOf('duplicate-key.yaml')).toEqual(['test/fixtures/config/duplicate-key.yaml:2: Map keys must be unique: onStoreFailure is set twice'])
    const nested = readFileSync('config/gateway.yaml', 'utf8').replace(
      'pro:        { perMinute: 300,  perDay: 10000 }',
      'pro:        { perMinute: 300,  perDay: 10000 }\n  free: { perMinute: 5, perDay: 50 }',
    )
    const freeTwice = nested.split('\n').findIndex((line) => line.includes('free: { perMinute: 5')) + 1
    expect(() => parseGatewayConfig(nested, 'x.yaml')).toThrow(`x.yaml:${freeTwice}: Map keys must be unique: plans.free is set twice`)
  })

  it('refuses a plan whose day limit is below its minute limit', () => {
    const text = readFileSync('config/gateway.yaml', 'utf8').replace('pro:        { perMinute: 300,  perDay: 10000 }', 'pro: { perMinute: 300, perDay: 200 }')
    expect(() => parseGatewayConfig(text, 'x.yaml')).toThrow(/x\.yaml:\d+: plans\.pro\.perDay must be at least perMinute/)
  })

  it('accepts a plan whose day limit equals its minute limit, and refuses one a request below it', () => {
    const withPro = (perDay: number) =>
      readFileSync('config/gateway.yaml', 'utf8').replace('pro:        { perMinute: 300,  perDay: 10000 }', `pro: { perMinute: 300, perDay: ${perDay} }`)
    expect(parseGatewayConfig(withPro(300), 'x.yaml').plans.pro).toEqual({ perMinute: 300, perDay: 300 })
    expect(() => parseGatewayConfig(withPro(299), 'x.yaml')).toThrow(/plans\.pro\.perDay must be at least perMinute/)
  })

  it('says plainly when the file cannot be read', () => {
    expect(() => loadGatewayConfig('config/nope.yaml', {})).toThrow(/config\/nope\.yaml: cannot be read \(ENOENT, looked for in \//)
  })
})

describe('gateway config: trusted proxies', () => {
  const WHY = 'must be an IP address, a CIDR range (10.0.0.0/8) or one of loopback, linklocal, uniquelocal'
  // proxy-addr would trust another host than the one named: 192.168.010.005 is 192.168.8.5 to it.
  const NOT_PLAIN = (part: string, read: string) => `${part} would be read as ${read}: write an IPv4 address as four plain decimal numbers, without leading zeros`

  it('names each server.trustedProxies entry the gateway could not use, with its line', () => {
    expect(problemsOf('bad-trusted-proxies.yaml')).toEqual([
      `test/fixtures/config/bad-trusted-proxies.yaml:8: server.trustedProxies.1 ${WHY} (invalid IP address: 999.1.1.1)`,
      `test/fixtures/config/bad-trusted-proxies.yaml:9: server.trustedProxies.2 ${WHY} (invalid range on address: 10.0.0.0/33)`,
      `test/fixtures/config/bad-trusted-proxies.yaml:13: server.trustedProxies.6 ${WHY} (invalid IP address: 10.0.0.1, 10.0.0.2)`,
      `test/fixtures/config/bad-trusted-proxies.yaml:14: server.trustedProxies.7 ${WHY} (invalid IP address: localhost)`,
      `test/fixtures/config/bad-trusted-proxies.yaml:15: server.trustedProxies.8 ${WHY} (${NOT_PLAIN('192.168.010.005', '192.168.8.5')})`,
      `test/fixtures/config/bad-trusted-proxies.yaml:16: server.trustedProxies.9 ${WHY} (${NOT_PLAIN('127.1', '127.0.0.1')})`,
      `test/fixtures/config/bad-trusted-proxies.yaml:17: server.trustedProxies.10 ${WHY} (${NOT_PLAIN('0x7f.1', '127.0.0.1')})`,
      `test/fixtures/config/bad-trusted-proxies.yaml:18: server.trustedProxies.11 ${WHY} (${NOT_PLAIN('10', '0.0.0.10')})`,
    ])
  })

  it('every entry check-config accepts, the gateway accepts at boot, and the refused ones would stop it', async () => {
    const accepted = ['10.0.0.0/8', 'loopback', 'linklocal', 'uniquelocal', '::1', '2001:db8::/32', '192.168.0.0/255.255.0.0']
    const text = shippedWith('trustedProxies: []', `trustedProxies: ${JSON.stringify(accepted)}`)
    const config = resolveGatewayConfig(parseGatewayConfig(text, 'x.yaml'), {})
    expect(config.server.trustedProxies).toEqual(accepted)
    // What gateway/src/app.ts does with them.
    const app = Fastify({ trustProxy: [...config.server.trustedProxies] })
    await app.ready()
    await app.close()
    for (const refused of ['999.1.1.1', '10.0.0.0/33']) expect(() => Fastify({ trustProxy: [refused] })).toThrow()
  })
})

describe('gateway config: plans', () => {
  it('refuses a config that leaves out a plan keys can have, or gives "custom" to a plan other than enterprise', () => {
    const NUMBERS = 'must be a positive integer (only the enterprise plan may be "custom")'
    expect(problemsOf('bad-plans.yaml')).toEqual([
      'test/fixtures/config/bad-plans.yaml:5: plans.free is required',
      `test/fixtures/config/bad-plans.yaml:6: plans.pro.perMinute ${NUMBERS}`,
      `test/fixtures/config/bad-plans.yaml:10: plans.gold.perDay ${NUMBERS}`,
      'test/fixtures/config/bad-plans.yaml:11: plans.Platinum unknown key',
    ])
    // The two edits that once gave free keys pro's 300/min.
    expect(() => parseGatewayConfig(shippedWith(FREE_LINE, ''), 'x.yaml')).toThrow(new RegExp(`^.*\\n {2}x\\.yaml:${shippedLine('plans:')}: plans\\.free is required$`))
    expect(() => parseGatewayConfig(shippedWith(FREE_LINE, '  free: { perMinute: custom, perDay: 1000 }\n'), 'x.yaml')).toThrow(
      `x.yaml:${shippedLine('free:')}: plans.free.perMinute ${NUMBERS}`,
    )
  })

  it('refuses an enterprise plan with one limit "custom" and the other a number', () => {
    const text = shippedWith('enterprise: { perMinute: custom, perDay: custom }', 'enterprise: { perMinute: custom, perDay: 100000 }')
    expect(() => parseGatewayConfig(text, 'x.yaml')).toThrow(`x.yaml:${shippedLine('enterprise:')}: plans.enterprise must have both limits "custom" or neither`)
  })

  it("a key on a plan the config lacks, or on enterprise without limits of its own, gets the strictest limits, never a larger plan's", () => {
    const config = loadGatewayConfig('config/gateway.yaml', {})
    const limits = (key: { plan: string; perMinute: number | null; perDay: number | null }) => {
      const { minute, day } = limitsFor(key, config)
      return [minute.limit, day.limit]
    }
    expect(limits({ plan: 'pro', perMinute: null, perDay: null })).toEqual([300, 10_000])
    expect(limits({ plan: 'gold', perMinute: null, perDay: null })).toEqual([60, 1_000])
    expect(limits({ plan: 'enterprise', perMinute: null, perDay: null })).toEqual([60, 1_000])
    expect(limits({ plan: 'enterprise', perMinute: 5_000, perDay: 2_000_000 })).toEqual([5_000, 2_000_000])
    expect(keyLimit({ plan: 'gold', perMinute: null, perDay: null }, config.plans, 'perMinute')).toEqual({ limit: 60, failSafe: true })
    expect(keyLimit({ plan: 'free', perMinute: null, perDay: null }, config.plans, 'perMinute')).toEqual({ limit: 60, failSafe: false })
    // With a stricter extra plan, the strictest of each limit.
    const trial = resolveGatewayConfig(
      parseGatewayConfig(shippedWith(FREE_LINE, (line) => `${line}  trial: { perMinute: 10, perDay: 5000 }\n`), 'x.yaml'),
      {},
    )
    const { minute, day } = limitsFor({ plan: 'gone', perMinute: null, perDay: null }, trial)
    expect([minute.limit, day.limit]).toEqual([10, 1_000])
  })
})

describe('gateway config: YAML syntax errors', () => {
  it('reports a flow map left without its closing brace on the line where it opens', () => {
    expect(problemsOf('unclosed-flow-map.yaml')).toEqual([
      'test/fixtures/config/unclosed-flow-map.yaml:2: Flow map in block collection must be sufficiently indented and end with a }',
    ])
    const text = shippedWith('free:       { perMinute: 60,   perDay: 1000 }', 'free:       { perMinute: 60,   perDay: 1000')
    expect(() => parseGatewayConfig(text, 'x.yaml')).toThrow(`x.yaml:${shippedLine('free:')}: Flow map`)
  })

  it('says a file with no settings holds none (empty, comments only, a bare ---) rather than "(root) must be object"', () => {
    const none = 'test/fixtures/config/no-settings.yaml:1: the file holds no settings (empty, or comments only): it must hold the gateway config, as config/gateway.yaml does'
    expect(problemsOf('no-settings.yaml')).toEqual([none])
    for (const text of ['', '---\n', '{}\n']) expect(() => parseGatewayConfig(text, 'x.yaml'), JSON.stringify(text)).toThrow('x.yaml:1: the file holds no settings')
  })

  // The parser only warns of a tag it does not know and reads the value as the plain text after
  // it: check-config called the file valid, and the gateway used "REDIS_PREFIX" as the prefix.
  it('refuses a YAML tag it does not know (!env …), at its line, rather than reading the text after it', () => {
    const text = shippedWith('keyPrefix: ""', 'keyPrefix: !env REDIS_PREFIX')
    expect(() => parseGatewayConfig(text, 'x.yaml')).toThrow(ConfigError)
    try {
      parseGatewayConfig(text, 'x.yaml')
    } catch (error) {
      expect((error as ConfigError).problems).toEqual([
        `x.yaml:${shippedLine('keyPrefix:')}: the YAML tag !env is not supported: write the value itself ` +
          '(a setting that has an environment variable, as README lists, is overridden by it)',
      ])
    }
    // The standard tags still resolve as YAML says.
    expect(parseGatewayConfig(shippedWith('strikes: 10', 'strikes: !!int "10"')).bans.strikes).toBe(10)
  })

  // The YAML library threw a ReferenceError: check-config printed a stack trace, the reload log no line.
  it('refuses aliases that expand into a billion copies as a problem of the file, at its last alias', () => {
    expect(problemsOf('alias-bomb.yaml')).toEqual([
      'test/fixtures/config/alias-bomb.yaml:70: its aliases expand to more copies than any config needs ' +
        '(Excessive alias count indicates a resource exhaustion attack): write the settings out',
    ])
  })

  it('refuses a file larger than any config needs before parsing it (a reload of a generated file held the event loop for seconds)', () => {
    const generated = `${SHIPPED}\n${Array.from({ length: 5_000 }, (_, i) => `# line ${i} of something else`).join('\n')}\n`
    expect(() => parseGatewayConfig(generated, 'x.yaml')).toThrow(
      expect.objectContaining({ problems: [`x.yaml:1: the file is ${Buffer.byteLength(generated)} bytes, more than a gateway config needs (at most 65536; config/gateway.yaml is about 4 KB): is it the right file?`] }),
    )
  })

  it('measures a file by its bytes on disk: one over 64 KiB is refused by its size, one under it with bytes that are no UTF-8 (a Latin-1 comment) is read, and a folder is no file', () => {
    const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-config-size-'))
    try {
      const large = path.join(directory, 'large.yaml')
      const largeText = `${SHIPPED}\n${'# padding\n'.repeat(7_000)}`
      writeFileSync(large, largeText)
      expect(() => loadGatewayConfig(large, {})).toThrow(
        expect.objectContaining({ problems: [`${large}:1: the file is ${Buffer.byteLength(largeText)} bytes, more than a gateway config needs (at most 65536; config/gateway.yaml is about 4 KB): is it the right file?`] }),
      )
      // 0xE9 is é in Latin-1 and no UTF-8: read as U+FFFD, three bytes each once decoded.
      const latin1 = path.join(directory, 'latin1.yaml')
      const comments = Buffer.from(`# caf\xe9 ${'\xe9'.repeat(60)}\n`.repeat(400), 'latin1')
      writeFileSync(latin1, Buffer.concat([Buffer.from(SHIPPED), comments]))
      expect(Buffer.byteLength(readFileSync(latin1, 'utf8'))).toBeGreaterThan(65_536)
      expect(loadGatewayConfig(latin1, {}).plans.free).toEqual({ perMinute: 60, perDay: 1_000 })
      // A folder of many files is over 64 KiB as a directory: it is said to be one, as before the cap.
      const folder = path.join(directory, 'folder')
      mkdirSync(folder)
      for (let i = 0; i < 3_000; i++) writeFileSync(path.join(folder, `file-with-a-longish-name-${i}`), '')
      expect(() => loadGatewayConfig(folder, {})).toThrow(expect.objectContaining({ problems: [`${folder}: cannot be read (EISDIR)`] }))
    } finally {
      rmSync(directory, { recursive: true, force: true })
    }
  })

  it('names at most ten aliases without their anchor, and counts the rest', () => {
    const aliases = Array.from({ length: 25 }, (_, i) => `  - *missing${i}`).join('\n')
    const problems = (() => {
      try {
        parseGatewayConfig(`${SHIPPED}\nextra:\n${aliases}\n`, 'x.yaml')
      } catch (error) {
        return (error as ConfigError).problems
      }
      throw new Error('the config was accepted')
    })()
    const first = SHIPPED.split('\n').length + 2
    expect(problems).toEqual([
      ...Array.from({ length: 10 }, (_, i) => `x.yaml:${first + i}: the alias *missing${i} names no anchor (&missing${i}) set before it`),
      `x.yaml:${first + 10}: and 15 more aliases naming no anchor, from here on`,
    ])
  })

  it('names an alias without its anchor (a typo) at its own line, not as an alias bomb at the last alias', () => {
    expect(problemsOf('unknown-alias.yaml')).toEqual([
      `test/fixtures/config/unknown-alias.yaml:${shippedLine('pro:')}: the alias *Free names no anchor (&Free) set before it`,
    ])
  })

  it('says YAML merge keys are not supported, at their line, rather than calling << an unknown key', () => {
    expect(problemsOf('merge-key.yaml')).toEqual([
      `test/fixtures/config/merge-key.yaml:${shippedLine('pro:')}: YAML merge keys (<<) are not supported: write the settings out (anchors and aliases work)`,
    ])
  })
})

describe('gateway config reload', () => {
  let directory: string | undefined
  afterEach(() => {
    if (directory) rmSync(directory, { recursive: true, force: true })
    directory = undefined
  })

  /** A config source on a private copy of the shipped file, and what it logs. */
  function watchedCopy() {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-config-test-'))
    const file = path.join(directory, 'gateway.yaml')
    writeFileSync(file, SHIPPED)
    const logs: { level: number; msg: string; settings?: string[]; problems?: string[] }[] = []
    const logger = pino({ level: 'info' }, { write: (line: string) => void logs.push(JSON.parse(line) as (typeof logs)[number]) })
    return { file, logs, source: createConfigSource(file, {}, logger) }
  }
  const WARN = 40
  const ERROR = 50

  it('a reload that changes settings read only at start warns which ones take effect at the next start', () => {
    const { file, logs, source } = watchedCopy()
    let text = SHIPPED
    for (const [from, to] of [
      ['trustedProxies: []', 'trustedProxies: [10.0.0.0/8]'],
      ['maxEntries: 10000', 'maxEntries: 500'],
      ['ttlSeconds: 60', 'ttlSeconds: 30'],
      ['onStoreFailure: open', 'onStoreFailure: closed'],
      ['free:       { perMinute: 60,', 'free:       { perMinute: 30,'],
    ] as const) {
      expect(text).toContain(from)
      text = text.replace(from, to)
    }
    writeFileSync(file, text)
    expect(source.reload()).toBe(true)
    expect(source.get().plans.free).toEqual({ perMinute: 30, perDay: 1_000 })
    const warnings = logs.filter((entry) => entry.level === WARN)
    expect(warnings).toHaveLength(1)
    expect(warnings[0]?.settings).toEqual(['server.trustedProxies', 'keyCache.maxEntries', 'keyCache.ttlSeconds', 'onStoreFailure'])
    expect(warnings[0]?.msg).toBe(
      'gateway config: server.trustedProxies, keyCache.maxEntries, keyCache.ttlSeconds, onStoreFailure changed but take effect only at the next start',
    )

    // A reload that changes only what follows reloads warns about nothing.
    logs.length = 0
    writeFileSync(file, text.replace('free:       { perMinute: 30,', 'free:       { perMinute: 20,'))
    expect(source.reload()).toBe(true)
    expect(logs.map((entry) => entry.msg)).toEqual(['gateway config reloaded'])

    // Nor does one that puts them back to what is running.
    logs.length = 0
    writeFileSync(file, SHIPPED)
    expect(source.reload()).toBe(true)
    expect(logs.map((entry) => entry.msg)).toEqual(['gateway config reloaded'])
  })

  it('a reload with an unusable trusted proxy, or without a plan keys can have, keeps the running config and names the line', () => {
    const { file, logs, source } = watchedCopy()
    const running = source.get()
    writeFileSync(file, shippedWith('trustedProxies: []', 'trustedProxies: [999.1.1.1, "10.0.0.0/33"]'))
    expect(source.reload()).toBe(false)
    writeFileSync(file, shippedWith(FREE_LINE, ''))
    expect(source.reload()).toBe(false)
    expect(source.get()).toBe(running)
    expect(logs.filter((entry) => entry.level === ERROR).map((entry) => entry.problems)).toEqual([
      [
        expect.stringMatching(new RegExp(`^${escape(file)}:${shippedLine('trustedProxies:')}: server\\.trustedProxies\\.0 must be .*999\\.1\\.1\\.1`)),
        expect.stringMatching(new RegExp(`^${escape(file)}:${shippedLine('trustedProxies:')}: server\\.trustedProxies\\.1 must be .*10\\.0\\.0\\.0/33`)),
      ],
      [`${file}:${shippedLine('plans:')}: plans.free is required`],
    ])
  })
})

const escape = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')

