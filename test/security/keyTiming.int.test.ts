import { createHash, randomInt } from 'node:crypto'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import type pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { isWellFormedApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { startGatewayProcess, type GatewayProcess } from '../ops/gatewayProcess.ts'
import { recordScenario } from '../helpers/scenarioLog.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { killAll } from '../scripts/processes.ts'
import { LOADED_MACHINE, compareWithBaseline, median, type GroupComparison } from './timingStatistics.ts'

const TEST_FILE = 'test/security/keyTiming.int.test.ts'
const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
const WARM_UP_ROUNDS = 30
const ROUNDS = Number(process.env.KEY_TIMING_ROUNDS ?? 200)

const randomBase62 = (length: number) => Array.from({ length }, () => ALPHABET[randomInt(62)]).join('')

/** The key format's checksum (6 base62 digits of SHA-256 over the body), so a guess can carry a valid one. */
function checksum(body: string): string {
  let value = createHash('sha256').update(body).digest().readUIntBE(0, 6)
  let out = ''
  for (let i = 0; i < 6; i++) {
    out = ALPHABET[value % 62] + out
    value = Math.floor(value / 62)
  }
  return out
}

/** A guess sharing the first `shared` characters after `aas_` with the real key; its checksum is wrong. */
function brokenChecksumGuess(real: string, shared: number): string {
  for (;;) {
    const guess = `aas_${real.slice(4, 4 + shared)}${randomBase62(38 - shared)}`
    if (guess !== real && !isWellFormedApiKey(guess)) return guess
  }
}

/** A guess sharing the first `shared` body characters with the real key, with a valid checksum: unknown. */
function unknownGuess(real: string, shared: number): string {
  for (;;) {
    const body = `${real.slice(4, 4 + shared)}${randomBase62(32 - shared)}`
    const guess = `aas_${body}${checksum(body)}`
    if (guess !== real) return guess
  }
}

const GROUPS: [string, (real: string) => string][] = [
  ...[0, 8, 16, 24, 32, 36].map((shared): [string, (real: string) => string] => [`bad checksum, ${shared} shared`, (real) => brokenChecksumGuess(real, shared)]),
  ...[0, 8, 16, 24, 28].map((shared): [string, (real: string) => string] => [`unknown, ${shared} shared`, (real) => unknownGuess(real, shared)]),
]

describe('how long an invalid key takes to refuse', () => {
  const database = suiteDatabase()
  let pool: pg.Pool
  let upstream: http.Server
  let gateway: GatewayProcess & { cleanup(): void }
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })

  beforeAll(async () => {
    // The gateway is ready once its upstream answers at all; no request here gets past a 401.
    upstream = http.createServer((_request, response) => response.writeHead(200, { 'content-type': 'application/json' }).end('[]'))
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
    gateway = await startGatewayProcess({
      databaseUrl: database.url,
      petsUrl: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
      configure: (file) => {
        file.anonymous.perMinute = 1_000_000
      },
      readyTimeoutMillis: 30_000,
    })
    pool = createPool({ connectionString: database.url, applicationName: 'timing-test', max: 1 })
  })
  afterAll(async () => {
    agent.destroy()
    await killAll()
    gateway?.cleanup()
    await new Promise((resolve) => upstream?.close(resolve))
    await pool?.end()
  })

  /** One request, over the one keep-alive connection; the time to the end of the answer, in µs. */
  function timedRequest(key: string): Promise<{ status: number; micros: number }> {
    const { hostname, port } = new URL(gateway.url)
    return new Promise((resolve, reject) => {
      const started = process.hrtime.bigint()
      const request = http.get({ hostname, port, path: '/v1/pets', agent, headers: { authorization: `Bearer ${key}` } }, (response) => {
        response.resume()
        response.on('end', () => resolve({ status: response.statusCode ?? 0, micros: Number(process.hrtime.bigint() - started) / 1_000 }))
      })
      request.on('error', reject)
      request.setTimeout(10_000, () => request.destroy(new Error('no answer within 10 s')))
    })
  }

  it('does not depend on how much of a real key was guessed', { timeout: 120_000 }, async () => {
    const { key: real } = await createKeyRepository(pool).create({ name: 'the real one', plan: 'free' })
    // The real key is admitted: the guesses share parts of a working key.
    expect((await timedRequest(real)).status).toBe(200)
    const samples = new Map<string, number[]>(GROUPS.map(([group]) => [group, []]))
    const statuses = new Set<number>()
    for (let round = 0; round < WARM_UP_ROUNDS + ROUNDS; round++) {
      // Interleaved, in a fresh random order each round: load and drift hit every group alike.
      const order = GROUPS.map((group) => ({ group, at: Math.random() })).sort((a, b) => a.at - b.at)
      for (const { group: [name, guess] } of order) {
        const { status, micros } = await timedRequest(guess(real))
        statuses.add(status)
        if (round >= WARM_UP_ROUNDS) samples.get(name)!.push(micros)
      }
    }
    expect([...statuses]).toEqual([401])

    const comparisons = [
      ...compareWithBaseline(new Map([...samples].filter(([name]) => name.startsWith('bad'))), 'bad checksum, 0 shared'),
      ...compareWithBaseline(new Map([...samples].filter(([name]) => name.startsWith('unknown'))), 'unknown, 0 shared'),
    ]
    const describe = (c: GroupComparison) => `${c.group}: median ${Math.round(c.medianMicros)} µs (${c.shiftMicros >= 0 ? '+' : ''}${Math.round(c.shiftMicros)}), z ${c.z.toFixed(1)}`
    console.log(`key refusal timing, ${ROUNDS} interleaved rounds:\n  ${comparisons.map(describe).join('\n  ')}`)
    expect(comparisons.filter((c) => c.differs).map(describe)).toEqual([])

    const spread = (prefix: string) => {
      const group = comparisons.filter((c) => c.group.startsWith(prefix))
      return `${Math.round(Math.min(...group.map((c) => c.medianMicros)))}–${Math.round(Math.max(...group.map((c) => c.medianMicros)))} µs`
    }
    const largestZ = Math.max(...comparisons.map((c) => Math.abs(c.z)))
    recordScenario({
      area: 'Security',
      scenario: 'Guessing a key one part at a time: guesses sharing 0 to 36 characters with a real key, bad checksum or valid checksum but unknown, timed over HTTP',
      answered: `401 invalid_api_key every time; ${ROUNDS} interleaved rounds of ${GROUPS.length} groups; medians ${spread('bad')} (bad checksum) and ${spread('unknown')} (unknown, Postgres asked), whatever was shared; largest rank-test |z| ${largestZ.toFixed(1)} (limit ${LOADED_MACHINE.zLimit} with a shift over ${LOADED_MACHINE.minShiftMicros} µs or ${LOADED_MACHINE.relativeShift * 100} %)`,
      lost: `nothing: no group answered measurably faster or slower than a guess sharing nothing (median of all ${median([...samples.values()].flat()).toFixed(0)} µs)`,
      test: TEST_FILE,
    })
  })
})
