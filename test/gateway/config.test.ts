import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import {
  ConfigError,
  loadGatewayConfig,
  parseGatewayConfig,
  resolveGatewayConfig,
} from '../../gateway/src/config/loadConfig.ts'

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
    expect(config.upstreams.pets).toEqual({ url: 'http://127.0.0.1:3001', timeoutMillis: 10_000 })
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
    const clustered = resolveGatewayConfig(file, { REDIS_CLUSTER_NODES: 'redis-a:7000, redis-b:7000', REDIS_URL: 'redis://r:6379' })
    expect(clustered.redis).toMatchObject({ url: 'redis://r:6379', clusterNodes: ['redis-a:7000', 'redis-b:7000'] })
    expect(() => resolveGatewayConfig(file, { GATEWAY_PORT: 'eighty' })).toThrow(/GATEWAY_PORT/)
  })

  it('names the line and key of an unknown key', () => {
    expect(problemsOf('unknown-key.yaml')).toEqual(['test/fixtures/config/unknown-key.yaml:6: plans.free.perHour unknown key'])
  })

  it('reports every bad value with its line', () => {
    expect(problemsOf('bad-values.yaml')).toEqual([
      'test/fixtures/config/bad-values.yaml:1: server.port must be <= 65535',
      'test/fixtures/config/bad-values.yaml:3: upstreams.pets.url must be an http:// or https:// URL',
      'test/fixtures/config/bad-values.yaml:6: plans.free.perMinute must be a positive integer or "custom"',
      'test/fixtures/config/bad-values.yaml:8: anonymous.perMinute must be >= 1',
      'test/fixtures/config/bad-values.yaml:9: bans.ladder.1 must be a duration like 60s, 5m, 1h, 24h',
      'test/fixtures/config/bad-values.yaml:10: onStoreFailure must be one of open, closed',
    ])
  })

  it('refuses window buckets that do not divide the window or would cost too much memory', () => {
    expect(problemsOf('bad-window.yaml')).toEqual([
      'test/fixtures/config/bad-window.yaml:8: windows.minute.bucket must divide the window length',
      'test/fixtures/config/bad-window.yaml:9: windows.day.bucket must leave at most 60 buckets in the window',
    ])
  })

  it('names a missing section', () => {
    expect(problemsOf('missing-section.yaml')).toEqual(['test/fixtures/config/missing-section.yaml:1: plans is required'])
  })

  it('reports YAML syntax errors and duplicate keys with their line', () => {
    expect(problemsOf('not-yaml.yaml')[0]).toMatch(/^test\/fixtures\/config\/not-yaml\.yaml:\d+: /)
    expect(problemsOf('duplicate-key.yaml')).toEqual(['test/fixtures/config/duplicate-key.yaml:2: Map keys must be unique'])
  })

  it('refuses a plan whose day limit is below its minute limit', () => {
    const text = readFileSync('config/gateway.yaml', 'utf8').replace('pro:        { perMinute: 300,  perDay: 10000 }', 'pro: { perMinute: 300, perDay: 200 }')
    expect(() => parseGatewayConfig(text, 'x.yaml')).toThrow(/x\.yaml:\d+: plans\.pro\.perDay must be at least perMinute/)
  })

  it('says plainly when the file cannot be read', () => {
    expect(() => loadGatewayConfig('config/nope.yaml', {})).toThrow(/config\/nope\.yaml: cannot be read \(ENOENT\)/)
  })
})
