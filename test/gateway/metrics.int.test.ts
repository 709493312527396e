import { pino } from 'pino'
import { Registry } from 'prom-client'
import { describe, expect, it } from 'vitest'
import { buildOpsServer } from '../../common/src/ops/opsServer.ts'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createGatewayMetrics } from '../../gateway/src/metrics/gatewayMetrics.ts'
import { refusingUpstream } from '../helpers/fakeUpstreams.ts'
import { startGateway } from '../helpers/gateway.ts'
import { openRaw } from '../helpers/rawClient.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../helpers/redis.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/** Each metric family the gateway promises, with the labels its samples carry. */
const FAMILIES: Record<string, string[]> = {
  http_requests_total: ['method', 'route', 'status_class', 'plan'],
  http_requests_refused_total: ['status'],
  http_request_duration_seconds_bucket: ['method', 'route', 'status_class', 'plan', 'le'],
  gateway_auth_failures_total: ['reason'],
  gateway_rate_limit_requests_total: ['plan', 'outcome', 'source'],
  gateway_rate_limit_window_decisions_total: ['plan', 'window', 'outcome'],
  gateway_rate_limit_near_limit_total: ['plan', 'window'],
  gateway_bans_total: ['step'],
  gateway_active_bans: [],
  gateway_rate_limit_store_duration_seconds_bucket: ['store', 'le'],
  gateway_key_cache_lookups_total: ['result'],
  gateway_key_cache_entries: [],
  gateway_upstream_duration_seconds_bucket: ['upstream', 'status_class', 'le'],
  gateway_upstream_errors_total: ['upstream', 'kind'],
  gateway_upstream_in_flight: ['upstream'],
  gateway_upstream_max_in_flight: ['upstream'],
  gateway_rate_limit_store_errors_total: ['store', 'kind'],
  gateway_config_reloads_total: ['outcome'],
  gateway_config_last_reload_successful: [],
  pg_pool_connections: ['state'],
  process_cpu_seconds_total: [],
}

function samples(text: string, family: string): Record<string, string>[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith(`${family}{`) || line.startsWith(`${family} `))
    .map((line) => Object.fromEntries([...line.matchAll(/(\w+)="([^"]*)"/g)].map((match) => [match[1]!, match[2]!])))
}

describe('gateway metrics', () => {
  const database = suiteDatabase()
  const prefix = suiteKeyPrefix()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() =>
    startGateway({
      databaseUrl: database.url,
      petsUrl: pets.url,
      env: { REDIS_URL: TEST_REDIS_URL },
      configure: (file) => {
        file.redis.keyPrefix = prefix
        file.redis.commandTimeoutMillis = 1_000
        file.bans = { strikes: 2, ladder: ['60s', '5m'] }
      },
    }),
  )

  it('exports each ban step at zero before any ban, so that a rate over the counter sees a gateway\'s first bans', async () => {
    expect(samples(await gateway.registry.metrics(), 'gateway_bans_total')).toEqual([{ step: '0' }, { step: '1' }])
    expect(await gateway.registry.metrics()).toMatch(/gateway_bans_total\{step="0"\} 0\n/)
  })

  it('says whether the file on disk is the config in force: 0 after a refused reload until a valid one', async () => {
    const registry = new Registry()
    const metrics = createGatewayMetrics(registry)
    const gauge = async () => /^gateway_config_last_reload_successful (\d+)$/m.exec(await registry.metrics())?.[1]
    expect(await gauge()).toBe('1')
    metrics.configReload('failure')
    expect(await gauge()).toBe('0')
    metrics.configReload('success')
    expect(await gauge()).toBe('1')
  })

  it('counts each reload under its outcome, a refused one as failure', async () => {
    const registry = new Registry()
    const metrics = createGatewayMetrics(registry)
    const reloads = async () =>
      Object.fromEntries([...(await registry.metrics()).matchAll(/^gateway_config_reloads_total\{outcome="(\w+)"\} (\d+)$/gm)].map((m) => [m[1], Number(m[2])]))
    expect(await reloads()).toEqual({ success: 0, failure: 0 })
    metrics.configReload('failure')
    metrics.configReload('failure')
    metrics.configReload('success')
    expect(await reloads()).toEqual({ success: 1, failure: 2 })
  })

  it('counts the requests the HTTP parser refused before any route saw them, by status', async () => {
    const refused = async () =>
      Object.fromEntries([...(await gateway.registry.metrics()).matchAll(/^http_requests_refused_total\{status="(\d+)"\} (\d+)$/gm)].map((m) => [m[1], Number(m[2])]))
    const before = await refused()
    expect(before).toEqual({ 400: 0, 408: 0, 414: 0, 431: 0, 501: 0 })
    for (const bytes of ['not http at all\r\n\r\n', `GET /v1/pets HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 'FOO /v1/pets HTTP/1.1\r\nHost: x\r\n\r\n']) {
      const connection = await openRaw(gateway.url)
      connection.socket.write(bytes)
      await connection.closed
      expect(connection.answer()).toMatch(/^HTTP\/1\.1 (400|431|501) /)
    }
    expect(await refused()).toEqual({ 400: 1, 408: 0, 414: 0, 431: 1, 501: 1 })
  })

  it('exports every family with bounded labels, and never a key or key id', async () => {
    const { key, id } = await gateway.createKey({ plan: 'enterprise', perMinute: 5, perDay: 100 })
    const unknown = generateApiKey()
    for (let i = 0; i < 8; i++) await gateway.request('/v1/pets', { key })
    await gateway.request('/v1/pets')
    await gateway.request('/v1/pets', { key: 'aas_malformed' })
    await gateway.request('/v1/pets', { key: unknown })
    const ops = buildOpsServer({
      registry: gateway.registry,
      logger: pino({ level: 'silent' }),
      isAccepting: () => true,
      dependencies: {},
    })
    await ops.listen({ host: '127.0.0.1', port: 0 })
    try {
      const address = ops.server.address() as { port: number }
      const response = await fetch(`http://127.0.0.1:${address.port}/metrics`)
      const text = await response.text()
      for (const [family, labels] of Object.entries(FAMILIES)) {
        const found = samples(text, family)
        expect(found.length, `${family} is exported`).toBeGreaterThan(0)
        for (const sample of found) expect(Object.keys(sample).sort(), family).toEqual([...labels].sort())
      }
      expect(text).toMatch(/gateway_auth_failures_total\{reason="malformed"\} 1/)
      expect(text).toMatch(/gateway_auth_failures_total\{reason="unknown"\} 1/)
      expect(text).toMatch(/gateway_auth_failures_total\{reason="revoked_or_expired"\} 0/)
      expect(samples(text, 'gateway_bans_total')).toEqual([{ step: '0' }, { step: '1' }])
      expect(text).toMatch(/gateway_bans_total\{step="0"\} 1\n/)
      expect(text).toMatch(/gateway_rate_limit_requests_total\{plan="enterprise",outcome="admitted",source="store"\} 5/)
      // The seventh was banned by Redis; the eighth was answered from the ban cache, without Redis.
      expect(text).toMatch(/gateway_rate_limit_requests_total\{plan="enterprise",outcome="banned",source="store"\} 1\n/)
      expect(text).toMatch(/gateway_rate_limit_requests_total\{plan="enterprise",outcome="banned",source="ban_cache"\} 1\n/)
      expect(text).toMatch(/gateway_rate_limit_window_decisions_total\{plan="enterprise",window="minute",outcome="exceeded"\} 1/)
      // The request refused for its minute had 94 of its day left: the day window had room, and
      // is not reported spent (six decisions carried windows: five admitted, one limited).
      expect(text).toMatch(/gateway_rate_limit_window_decisions_total\{plan="enterprise",window="minute",outcome="allowed"\} 5\n/)
      expect(text).toMatch(/gateway_rate_limit_window_decisions_total\{plan="enterprise",window="day",outcome="allowed"\} 6\n/)
      expect(text).not.toMatch(/gateway_rate_limit_window_decisions_total\{plan="enterprise",window="day",outcome="exceeded"\}/)
      expect(text).toMatch(/gateway_rate_limit_near_limit_total\{plan="enterprise",window="minute"\} 2/)
      // Seven keyed decisions (the seventh started a ban, so the eighth was refused from the ban
      // cache) and the unknown key, a guess counted per IP in Redis.
      expect(text).toMatch(/gateway_rate_limit_store_duration_seconds_count\{store="redis"\} 8/)
      expect(text).toMatch(/http_requests_total\{method="GET",route="\/v1\/pets",status_class="2xx",plan="enterprise"\} 5/)
      // A request without a valid key is counted under the per-IP limit's name.
      expect(text).toMatch(/http_requests_total\{method="GET",route="\/v1\/pets",status_class="4xx",plan="anonymous"\} \d+/)
      // Every request has ended by the scrape; the bound is the shipped default.
      expect(text).toMatch(/gateway_upstream_in_flight\{upstream="pets"\} 0\n/)
      expect(text).toMatch(/gateway_upstream_max_in_flight\{upstream="pets"\} 1024\n/)
      expect(text).not.toContain(key)
      expect(text).not.toContain(id)
      expect(text).not.toContain(unknown)
    } finally {
      await ops.close()
    }
  })

  // A 505 says nothing about the key: counted as a failure, each such request without a key read
  // as a client failing to authenticate on the auth-failure panel.
  it('does not count a request line naming HTTP/2.0 or HTTP/0.9, answered 505, as an authentication failure, with or without a key', async () => {
    const failures = async () =>
      Object.fromEntries([...(await gateway.registry.metrics()).matchAll(/^gateway_auth_failures_total\{reason="(\w+)"\} (\d+)$/gm)].map((m) => [m[1], Number(m[2])]))
    const before = await failures()
    for (const version of ['HTTP/2.0', 'HTTP/0.9']) {
      for (const authorization of ['', 'Authorization: Bearer aas_malformed\r\n', `Authorization: Bearer ${generateApiKey()}\r\n`]) {
        const connection = await openRaw(gateway.url)
        connection.socket.write(`GET /v1/pets ${version}\r\nHost: x\r\n${authorization}\r\n`)
        await connection.closed
        expect(connection.answer()).toMatch(/^HTTP\/1\.1 505 [^]*"code":"http_version_not_supported"/)
      }
    }
    expect(await failures()).toEqual(before)
    // The same request as HTTP/1.1 is still counted.
    await gateway.request('/v1/pets')
    expect(await failures()).toEqual({ ...before, missing: before.missing! + 1 })
  })

  it("counts a key's first request a key-cache miss and the ones after it hits", async () => {
    const lookups = async () =>
      Object.fromEntries([...(await gateway.registry.metrics()).matchAll(/^gateway_key_cache_lookups_total\{result="(\w+)"\} (\d+)$/gm)].map((m) => [m[1], Number(m[2])]))
    const { key } = await gateway.createKey()
    await gateway.announced(key)
    const before = await lookups()
    for (let i = 0; i < 3; i++) expect((await gateway.request('/v1/pets', { key })).status).toBe(200)
    expect(await lookups()).toEqual({ hit: before.hit! + 2, miss: before.miss! + 1 })
  })
})

describe('gateway metrics with an orders upstream configured', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const orders = suiteService(refusingUpstream)
  const gateway = suiteService(() =>
    startGateway({
      databaseUrl: database.url,
      petsUrl: pets.url,
      configure: (file) => void (file.upstreams.orders = { url: orders.url }),
    }),
  )

  it("exports the orders upstream's series under upstream=\"orders\", at zero before its first request, and counts its failures there", async () => {
    const before = await gateway.registry.metrics()
    for (const upstream of ['pets', 'orders']) {
      for (const kind of ['timeout', 'connect', 'protocol', 'saturated']) {
        expect(before).toContain(`gateway_upstream_errors_total{upstream="${upstream}",kind="${kind}"} 0\n`)
      }
      expect(before).toContain(`gateway_upstream_max_in_flight{upstream="${upstream}"} 1024\n`)
    }

    const { key } = await gateway.createKey()
    const answer = await gateway.request('/v1/store/orders', { key, contract: false })
    expect(answer.status).toBe(502)
    const after = await gateway.registry.metrics()
    expect(after).toContain('gateway_upstream_errors_total{upstream="orders",kind="connect"} 1\n')
    expect(after).toContain('gateway_upstream_errors_total{upstream="pets",kind="connect"} 0\n')
  })
})
