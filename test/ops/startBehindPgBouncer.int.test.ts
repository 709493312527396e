import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { pgbouncerAvailable, startPgBouncer, type PrivatePgBouncer } from '../helpers/pgbouncer.ts'
import { cuttableRelay } from '../helpers/tcpRelay.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { baseEnv, freePort, killAll, startNode, waitForOutput, waitForReady } from '../scripts/processes.ts'
import { OPS_TEST_TOKEN } from './gatewayProcess.ts'

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/**
 * README, Start-up order: a service waits for a Postgres that is not there yet (Postgres
 * restarting). Behind PgBouncer, a Postgres that is down is not a refused connection but
 * PgBouncer's 08P01 "server login has been failing, try again later (server_login_retry)": the
 * service took it for a refusal that waiting cannot mend and exited 1 within seconds.
 */
describe.skipIf(!pgbouncerAvailable())('starting behind PgBouncer while the Postgres behind it is down', () => {
  const database = suiteDatabase()
  let relay: Awaited<ReturnType<typeof cuttableRelay>>
  let pooler: PrivatePgBouncer | undefined

  beforeAll(async () => {
    const target = new URL(database.url)
    relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || 5432) })
    const behindRelay = new URL(database.url)
    behindRelay.host = `127.0.0.1:${relay.port}`
    pooler = await startPgBouncer(behindRelay.toString(), {
      pool_mode: 'transaction',
      ignore_startup_parameters: 'statement_timeout,idle_in_transaction_session_timeout',
      // How long PgBouncer waits after a failed login before it tries the server again (15 s by
      // default): the service must outwait it alive either way, and here it is back sooner.
      server_login_retry: '3',
    })
  }, 30_000)
  afterEach(killAll)
  afterAll(async () => {
    await pooler?.close()
    await relay?.close()
  })

  it('the pets-service waits for it, alive, and becomes ready once it is back', async () => {
    await relay.cut()
    const opsPort = await freePort()
    const service = startNode('pets-service/src/main.ts', {
      ...baseEnv(),
      LOG_LEVEL: 'info',
      DATABASE_URL: pooler!.url,
      INTERNAL_TOKEN: OPS_TEST_TOKEN,
      PETS_HOST: '127.0.0.1',
      PETS_PORT: String(await freePort()),
      PETS_OPS_HOST: '127.0.0.1',
      PETS_OPS_PORT: String(opsPort),
    })
    await waitForOutput(service, 'server login has been failing', 30_000)
    await sleep(2_000)
    expect(service.hasExited(), service.output()).toBe(false)
    expect(service.output()).toContain('waiting for Postgres at DATABASE_URL')

    await relay.restore()
    // PgBouncer tries the server again once server_login_retry (3 s here) has passed.
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, service, 40_000)
  }, 90_000)
})
