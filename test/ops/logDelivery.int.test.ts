import { afterAll, describe, expect, it } from 'vitest'
import { LOG_FLUSH_MILLIS } from '../../common/src/logger.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { TOKEN, baseEnv, freePort, killAll, petsClient, startNode, waitForOutput, waitForReady } from '../scripts/processes.ts'

const database = suiteDatabase()
afterAll(async () => {
  await killAll()
})

describe('logs of a quiet service', () => {
  // Regression: lines were batched until 4 KiB had gathered, so one request's line could wait
  // for the next few dozen requests, or be lost with the process.
  it('a lone request\'s line reaches stdout while the service keeps running, within the flush period', async () => {
    const port = await freePort()
    const opsPort = await freePort()
    const env = { ...baseEnv(), LOG_LEVEL: 'info', DATABASE_URL: database.url, INTERNAL_TOKEN: TOKEN, PETS_PORT: String(port), PETS_OPS_PORT: String(opsPort) }
    const pets = startNode('pets-service/src/main.ts', env)
    await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, pets, 60_000)

    const response = await petsClient(port).list()
    expect(response.status).toBe(200)
    const requestId = response.headers.get('x-request-id') as string
    await response.body?.cancel()
    // Generous against a loaded machine; the batch alone would hold the line until the process ends.
    await waitForOutput(pets, `"requestId":"${requestId}"`, LOG_FLUSH_MILLIS + 2_000)
    expect(pets.hasExited()).toBe(false)
    const line = pets.output().split('\n').find((text) => text.includes(requestId)) as string
    expect(JSON.parse(line)).toMatchObject({ service: 'pets-service', requestId, method: 'GET', route: '/pets', status: 200, msg: 'request completed' })
  }, 90_000)
})
