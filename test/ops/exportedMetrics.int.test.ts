import { pino } from 'pino'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildOpsServer } from '../../common/src/ops/opsServer.ts'
import { generateApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { startGateway, type RunningGateway } from '../helpers/gateway.ts'
import { TEST_INTERNAL_TOKEN } from '../helpers/petsService.ts'
import { TEST_REDIS_URL, suiteKeyPrefix } from '../helpers/redis.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { baseEnv, freePort, killAll, startNode, waitForReady, type NodeProcess } from '../scripts/processes.ts'
import { PROMETHEUS_SYNTHETIC, TARGET_LABELS, parseExposition, type Job } from './exportedSeries.ts'
import {
  PROMTOOL_MISSING,
  dashboardExpressions,
  groupingLabels,
  jobsOf,
  promtool,
  ruleExpressions,
  runPromtool,
  selectors,
} from './promql.ts'

/**
 * The source of truth for "a metric the services really export": a scrape of a running gateway
 * (the test helper, as test/gateway/metrics.int.test.ts builds it, on Redis) and of the real
 * pets-service process, after a little traffic. Every metric, matcher label and grouping label
 * the alert rules and the dashboard use must be in it.
 */
/**
 * Series a gateway registers only with server.tls (main.ts), absent from the plain-HTTP scrape
 * here, with their labels: gatewayTls.int.test.ts finds them in such a gateway's scrape.
 */
const ONLY_WITH_TLS = new Map([
  ['gateway_tls_reloads_total', ['outcome']],
  ['gateway_tls_last_reload_successful', []],
  ['gateway_tls_certificate_expiry_timestamp_seconds', []],
  ['gateway_tls_handshake_failures_total', ['reason']],
])

describe('metrics named by the alert rules and the dashboard exist in a live scrape', () => {
  const database = suiteDatabase()
  let pets: NodeProcess
  let gateway: RunningGateway
  const scrapes = {} as Record<Job, string>
  const prefix = suiteKeyPrefix()

  beforeAll(async () => {
    const [petsPort, petsOpsPort] = [await freePort(), await freePort()]
    pets = startNode('pets-service/src/main.ts', {
      ...baseEnv(),
      DATABASE_URL: database.url,
      INTERNAL_TOKEN: TEST_INTERNAL_TOKEN,
      PETS_HOST: '127.0.0.1',
      PETS_PORT: String(petsPort),
      PETS_OPS_HOST: '127.0.0.1',
      PETS_OPS_PORT: String(petsOpsPort),
      DATABASE_POOL_SIZE: '4',
    })
    await waitForReady(`http://127.0.0.1:${petsOpsPort}/readyz`, pets, 15_000)
    gateway = await startGateway({
      databaseUrl: database.url,
      petsUrl: `http://127.0.0.1:${petsPort}`,
      env: { REDIS_URL: TEST_REDIS_URL },
      configure: (file) => {
        file.redis.keyPrefix = prefix
        file.redis.commandTimeoutMillis = 1_000
        file.bans = { strikes: 2, ladder: ['60s'] }
      },
    })

    // Admitted, limited and banned requests, auth failures, an upstream answer.
    const { key } = await gateway.createKey({ plan: 'enterprise', perMinute: 3, perDay: 100 })
    for (let i = 0; i < 7; i++) await (await gateway.request('/v1/pets', { key })).body?.cancel()
    await (await gateway.request('/v1/pets')).body?.cancel()
    await (await gateway.request('/v1/pets', { key: generateApiKey() })).body?.cancel()

    const ops = buildOpsServer({ registry: gateway.registry, logger: pino({ level: 'silent' }), isAccepting: () => true, dependencies: {} })
    await ops.listen({ host: '127.0.0.1', port: 0 })
    try {
      scrapes.gateway = await (await fetch(`http://127.0.0.1:${(ops.server.address() as { port: number }).port}/metrics`)).text()
    } finally {
      await ops.close()
    }
    scrapes['pets-service'] = await (await fetch(`http://127.0.0.1:${petsOpsPort}/metrics`)).text()
  })
  afterAll(async () => {
    await gateway?.close()
    await killAll()
  })

  it('every metric and label the rules and the dashboard use is scraped from the job they select', () => {
    const series = { gateway: parseExposition(scrapes.gateway), 'pets-service': parseExposition(scrapes['pets-service']) }
    // The traffic reached the pets-service process through the gateway.
    expect(scrapes['pets-service']).toMatch(/http_requests_total\{method="GET",route="\/pets",status_class="2xx"\} \d+/)
    const problems: string[] = []
    for (const expression of [...ruleExpressions(), ...dashboardExpressions()]) {
      const labelsInExpression = new Set(TARGET_LABELS)
      for (const selector of selectors(expression.promql)) {
        // The TLS rules' series exist only on a gateway serving HTTPS itself: gatewayTls.int.test.ts
        // finds them in such a gateway's live scrape.
        const tlsLabels = ONLY_WITH_TLS.get(selector.metric)
        if (tlsLabels !== undefined) {
          for (const label of tlsLabels) labelsInExpression.add(label)
          continue
        }
        if (PROMETHEUS_SYNTHETIC.has(selector.metric)) {
          for (const matcher of selector.matchers) labelsInExpression.add(matcher.label)
          continue
        }
        const pinned = selector.matchers.some((matcher) => matcher.label === 'job')
        const jobs = jobsOf(selector).filter((job) => !pinned || series[job].has(selector.metric))
        const present = jobsOf(selector).filter((job) => series[job].has(selector.metric))
        if (present.length === 0 || (pinned && jobs.length < jobsOf(selector).length)) {
          problems.push(`${expression.where}: ${selector.metric} is not in the ${jobsOf(selector).join('/')} scrape`)
          continue
        }
        const labels = new Set(present.flatMap((job) => [...series[job].get(selector.metric)!]))
        for (const label of labels) labelsInExpression.add(label)
        for (const matcher of selector.matchers) {
          if (!TARGET_LABELS.has(matcher.label) && !labels.has(matcher.label)) {
            problems.push(`${expression.where}: ${selector.metric} has no label ${matcher.label}`)
          }
        }
      }
      for (const label of groupingLabels(expression.promql)) {
        if (!labelsInExpression.has(label)) problems.push(`${expression.where}: groups by ${label}, which none of its metrics has`)
      }
    }
    expect(problems).toEqual([])
  })

  it("opens at most DATABASE_POOL_SIZE Postgres connections per process, and the scrape says how many that is", () => {
    expect(scrapes['pets-service']).toMatch(/^pg_pool_connections\{state="max"\} 4$/m)
    const total = Number(/^pg_pool_connections\{state="total"\} (\d+)$/m.exec(scrapes['pets-service'])?.[1])
    expect(total).toBeGreaterThanOrEqual(1)
    expect(total).toBeLessThanOrEqual(4)
  })

  const tool = promtool()
  it.skipIf(!tool)(`promtool check metrics finds nothing in either scrape${tool ? '' : ` (skipped: ${PROMTOOL_MISSING})`}`, () => {
    for (const [job, text] of Object.entries(scrapes)) {
      const result = runPromtool(['check', 'metrics'], text)
      const problems = result.output.split('\n').filter((line) => line.trim() !== '')
      expect(problems, `${job}: ${result.output}`).toEqual([])
    }
  })
})
