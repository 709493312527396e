import v8 from 'node:v8'
import vm from 'node:vm'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { eventually } from '../../gateway/rateLimit/httpLimits.ts'
import { expectErrorResponse } from '../../helpers/assertions.ts'
import { startGateway, type RunningGateway } from '../../helpers/gateway.ts'
import { TEST_INTERNAL_TOKEN } from '../../helpers/petsService.ts'
import { recordScenario } from '../../helpers/scenarioLog.ts'
import { suiteDatabase } from '../../helpers/testDatabase.ts'
import { baseEnv, freePort, killAll, startNode, waitForPortClosed, waitForReady, type NodeProcess } from '../../scripts/processes.ts'

/** The gateway's upstream timeout in this file (upstreams.pets.timeoutSeconds; 10 s shipped). */
const TIMEOUT_SECONDS = 0.5
/** "502 at once" on a loaded 2-core machine: a connect that is refused takes milliseconds, a hang seconds. */
const REFUSED_WITHIN_MILLIS = 2_000
const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

// The test process's own garbage collector, for heap measurements of the in-process gateway.
v8.setFlagsFromString('--expose-gc')
const collectGarbage = vm.runInNewContext('gc') as () => void

/** Heap in use after full collections: what the process really holds on to. */
async function liveHeapBytes(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    collectGarbage()
    await sleep(50)
  }
  return process.memoryUsage().heapUsed
}

/**
 * The real pets-service (`pets-service/src/main.ts`, a child process) behind an in-process
 * gateway, broken the ways a process breaks: killed (connections refused), frozen with SIGSTOP
 * (connections accepted, nothing answered), frozen for less than the timeout (slow), and started
 * again on the same port.
 */
describe('pets-service down, hung, slow and restarted, through the gateway', () => {
  const database = suiteDatabase()
  let gateway: RunningGateway
  let key: string
  let pets: NodeProcess | undefined
  let port: number
  let opsPort: number

  async function startPets(): Promise<void> {
    pets = startNode('pets-service/src/main.ts', {
      ...baseEnv(),
      DATABASE_URL: database.url,
      INTERNAL_TOKEN: TEST_INTERNAL_TOKEN,
      PETS_PORT: String(port),
      PETS_OPS_PORT: String(opsPort),
    })
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, pets, 30_000)
  }

  async function killPets(): Promise<void> {
    const running = pets
    pets = undefined
    if (!running) return
    process.kill(running.pid, 'SIGCONT')
    running.kill()
    await running.exited
    await waitForPortClosed(port, 5_000)
  }

  const signal = (name: 'SIGSTOP' | 'SIGCONT') => process.kill(pets!.pid, name)

  async function timed(path = '/v1/pets?limit=1') {
    const started = performance.now()
    const response = await gateway.request(path, { key })
    return { response, millis: performance.now() - started }
  }

  beforeAll(async () => {
    port = await freePort()
    opsPort = await freePort()
    await startPets()
    gateway = await startGateway({
      databaseUrl: database.url,
      petsUrl: `http://127.0.0.1:${port}`,
      configure: (file) => {
        file.upstreams.pets.timeoutSeconds = TIMEOUT_SECONDS
      },
    })
    ;({ key } = await gateway.createKey({ plan: 'enterprise', perMinute: 1_000_000, perDay: 10_000_000 }))
    const first = await timed()
    expect(first.response.status).toBe(200)
    await first.response.arrayBuffer()
  })
  afterAll(async () => {
    if (pets) process.kill(pets.pid, 'SIGCONT')
    await gateway?.close()
    await killAll()
  })

  it('hung (SIGSTOP): 504 upstream_timeout after timeoutSeconds, and 200 again once it runs', async () => {
    signal('SIGSTOP')
    const answers = []
    try {
      for (let i = 0; i < 3; i++) {
        const { response, millis } = await timed()
        await expectErrorResponse(response, 504, 'upstream_timeout')
        expect(response.headers.get('x-ratelimit-limit'), 'rate-limit headers on a 504').not.toBeNull()
        // Not before the timeout, and not much after it (a hang would be the client's own patience).
        expect(millis).toBeGreaterThanOrEqual(TIMEOUT_SECONDS * 1_000 - 50)
        expect(millis).toBeLessThan(TIMEOUT_SECONDS * 1_000 + REFUSED_WITHIN_MILLIS)
        answers.push(millis)
      }
    } finally {
      signal('SIGCONT')
    }
    const { response, millis } = await timed()
    expect(response.status).toBe(200)
    await response.arrayBuffer()
    recordScenario({
      area: 'pets-service',
      scenario: `pets-service process frozen with SIGSTOP (connections accepted, nothing answered), gateway timeoutSeconds ${TIMEOUT_SECONDS}`,
      answered: `504 upstream_timeout with rate-limit headers after ${answers.map((value) => Math.round(value)).join(', ')} ms; the first request after SIGCONT 200 in ${Math.round(millis)} ms`,
      lost: 'nothing: 3 of 3 answered with the Error body, none left hanging; served again with no restart of the gateway',
      test: 'test/reliability/faults/upstream.int.test.ts',
    })
  })

  it('slow (frozen for half the timeout): 200 with the whole body, as late as the upstream was', async () => {
    const pauseMillis = (TIMEOUT_SECONDS * 1_000) / 2
    signal('SIGSTOP')
    const pending = timed()
    await sleep(pauseMillis)
    signal('SIGCONT')
    const { response, millis } = await pending
    expect(response.status).toBe(200)
    expect(Array.isArray(await response.json())).toBe(true)
    expect(millis).toBeGreaterThanOrEqual(pauseMillis - 50)
    recordScenario({
      area: 'pets-service',
      scenario: `pets-service slow: frozen ${pauseMillis} ms while a request is with it (timeout ${TIMEOUT_SECONDS} s)`,
      answered: `200 with the complete list after ${Math.round(millis)} ms`,
      lost: 'nothing: the slow answer was relayed whole, not cut off or turned into an error',
      test: 'test/reliability/faults/upstream.int.test.ts',
    })
  })

  it("keeps the gateway's heap flat across failed requests (504s and 502s)", async () => {
    const headers = { authorization: `Bearer ${key}` }
    async function burst(count: number, concurrency: number, expected: number): Promise<void> {
      let next = 0
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while (next++ < count) {
            const response = await fetch(`${gateway.url}/v1/pets?limit=1`, { headers })
            await response.arrayBuffer()
            expect(response.status).toBe(expected)
          }
        }),
      )
    }
    // Each failure path first runs unmeasured, as long as it is then measured and at the same
    // concurrency: the heap grows by about a megabyte over the first few hundred failures (code
    // compiled, connection pools and keep-alive sockets filled, caches sized) and is flat after.
    // Then the live heap after full collections is taken around the measured run.
    // A 504 is answered at the gateway's own timer, which aborts the exchange; a request still
    // waiting for a connection is let go of only when its connect ends (refused, or timed out a
    // timeout later: the frozen upstream's accept queue fills up), and on a loaded machine that
    // can take seconds. Measured right after a burst, the heap held however many were still
    // waiting at that instant (7 KB each): the measurement waits until the gateway counts none
    // outstanding, then a moment for the sockets' close events.
    async function exchangesEnded(): Promise<void> {
      const outstanding = async () => {
        const gauge = await gateway.registry.getSingleMetric('gateway_upstream_in_flight')!.get()
        return gauge.values.find((value) => value.labels.upstream === 'pets')?.value
      }
      await eventually(async () => (await outstanding()) === 0, 20_000, 50).catch(async () => {
        throw new Error(`${await outstanding()} requests still outstanding with the upstream 20 s after the burst`)
      })
      await sleep(200)
    }
    /**
     * Live-heap growth over a measured run, after one unmeasured: the smallest of three measured
     * in a row. A leak grows the heap in every one; what is compiled or sized once may still land
     * in the first two (measured here: 400 to 550 KB in each of the first two runs of 504s, under
     * 220 KB in the third; the fresh-clone CI run with the whole suite beside it once saw 710 KB
     * as the smaller of two).
     */
    async function growthOver(run: () => Promise<void>): Promise<number> {
      await run()
      const growths: number[] = []
      for (let i = 0; i < 3; i++) {
        const before = await liveHeapBytes()
        await run()
        growths.push((await liveHeapBytes()) - before)
      }
      return Math.min(...growths)
    }
    const timeouts = 600
    signal('SIGSTOP')
    const timeoutGrowth = await growthOver(async () => {
      await burst(timeouts, 100, 504)
      await exchangesEnded()
    })
    await killPets()
    // On a loaded machine connects begun while the upstream was frozen may still be ending: the
    // refusals are measured once the gateway answers a request with the refusal's 502.
    await eventually(async () => (await timed()).response.status === 502, 10_000, 50)
    const refusals = 1_000
    const refusalGrowth = await growthOver(() => burst(refusals, 20, 502))

    // A request's worth of leaked state (a socket, a timer, a request or reply object) is
    // kilobytes; the measured growth must stay under 1 KB per failed request, for each kind on
    // its own: the 502s' phase frees what the hung upstream held (killing it ends every
    // exchange), so a sum would hide a leak in the 504s'. One did hide there: requests answered
    // 504 stayed queued in undici behind connects the frozen upstream never accepted, about 2.7 KB
    // each (it now fails exchangesEnded: requests still outstanding 20 s on). Measured on this
    // machine since, the smallest of three runs: 110 to 360 bytes per 504 and under 100 per 502,
    // compiled code (a heap snapshot diff over 1,800 more 504s holds no request, reply, socket or
    // handler of theirs).
    const failed = timeouts + refusals
    const growth = timeoutGrowth + refusalGrowth
    const grew = `heap grew ${timeoutGrowth} bytes over ${timeouts} 504s, ${refusalGrowth} over ${refusals} 502s`
    expect(timeoutGrowth, grew).toBeLessThan(timeouts * 1_024)
    expect(refusalGrowth, grew).toBeLessThan(refusals * 1_024)

    const kb = (bytes: number) => `${Math.round(bytes / 1_024)} KB`
    recordScenario({
      area: 'pets-service',
      scenario: `${timeouts} requests to a hung pets-service (504) and ${refusals} to a dead one (502) through one gateway, each kind measured three times after one unmeasured run (the smallest growth counts)`,
      answered: `every one 504 upstream_timeout or 502 bad_gateway`,
      lost:
        `nothing, and no memory: live heap after full GC grew ${kb(timeoutGrowth)} over the 504s and ` +
        `${kb(refusalGrowth)} over the 502s (${Math.round(growth / failed)} bytes per failed request; bound 1 KB for each kind)`,
      test: 'test/reliability/faults/upstream.int.test.ts',
    })
  }, 90_000)

  it('down (killed) under steady traffic: 502 bad_gateway at once; restarted on its port, 200 again by itself', async () => {
    if (!pets) await startPets()
    const answers: { startedAt: number; millis: number; status: number; code?: string }[] = []
    let stopping = false
    const t0 = performance.now()
    const traffic = (async () => {
      while (!stopping) {
        const startedAt = performance.now() - t0
        const { response, millis } = await timed()
        const body = (await response.json()) as { code?: string }
        answers.push({ startedAt, millis, status: response.status, code: Array.isArray(body) ? undefined : body.code })
        await sleep(20)
      }
    })()
    let killedAt = 0
    let restartedAt = 0
    try {
      await sleep(300)
      killedAt = performance.now() - t0
      await killPets()
      await sleep(1_000)
      await startPets()
      restartedAt = performance.now() - t0
      await sleep(1_000)
    } finally {
      stopping = true
      await traffic
    }

    for (const answer of answers) {
      expect([200, 502], JSON.stringify(answer)).toContain(answer.status)
      if (answer.status === 502) {
        expect(answer.code).toBe('bad_gateway')
        expect(answer.millis).toBeLessThan(REFUSED_WITHIN_MILLIS)
      }
    }
    const down = answers.filter((answer) => answer.status === 502)
    expect(down.length, 'requests while the service was down').toBeGreaterThan(5)
    expect(answers.filter((answer) => answer.startedAt + answer.millis < killedAt).every((answer) => answer.status === 200)).toBe(true)
    // Recovery needs nothing from anyone: every request sent once the service is ready again is served.
    const afterRestart = answers.filter((answer) => answer.startedAt > restartedAt)
    expect(afterRestart.length).toBeGreaterThan(5)
    expect(afterRestart.filter((answer) => answer.status !== 200)).toEqual([])
    const lastFailure = Math.max(...down.map((answer) => answer.startedAt + answer.millis))

    recordScenario({
      area: 'pets-service',
      scenario: 'pets-service process killed (connections refused) under steady traffic, then started again on its port',
      answered:
        `${down.length} × 502 bad_gateway while down, slowest ${Math.round(Math.max(...down.map((answer) => answer.millis)))} ms; ` +
        `${afterRestart.length} of ${afterRestart.length} requests after the restart 200 (last failure ${Math.round(lastFailure - restartedAt)} ms relative to ready)`,
      lost: `nothing: ${answers.length} requests, each answered 200 or 502 with the Error body; no gateway restart needed`,
      test: 'test/reliability/faults/upstream.int.test.ts',
    })
    // Two pets-service starts, each of which may wait up to 30 s on a loaded machine.
  }, 90_000)
})
