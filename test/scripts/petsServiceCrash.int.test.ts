import { afterAll, afterEach, describe, expect, it } from 'vitest'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { baseEnv, freePort, killAll, petBody, petsClient, startNode, TOKEN, waitForPortClosed, waitForReady } from './processes.ts'

// `npm run start:pets` against a real Postgres, killed without any chance to shut down.
const READY_MILLIS = 60_000

const database = suiteDatabase()
afterEach(killAll)
afterAll(async () => {
  await killAll()
})

describe('pets-service on a real Postgres', () => {
  it(
    'a pet answered 201 is there after the service is SIGKILLed and started again',
    async () => {
      const port = await freePort()
      const opsPort = await freePort()
      const env = {
        ...baseEnv(),
        DATABASE_URL: database.url,
        INTERNAL_TOKEN: TOKEN,
        PETS_PORT: String(port),
        PETS_OPS_PORT: String(opsPort),
      }
      const pets = petsClient(port)

      const first = startNode('pets-service/src/main.ts', env)
      await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, first, READY_MILLIS)
      const created = await pets.create({ name: 'Rex', categoryId: 1 })
      expect(created.status).toBe(201)
      const rex = await petBody(created)
      first.kill()
      expect(await first.exited).toEqual({ code: null, signal: 'SIGKILL' })
      await waitForPortClosed(port, 5_000)

      const second = startNode('pets-service/src/main.ts', env)
      await waitForReady(`http://127.0.0.1:${opsPort}/readyz`, second, READY_MILLIS)
      const fetched = await pets.get(rex.id)
      expect(fetched.status).toBe(200)
      expect(await fetched.json()).toEqual(rex)
    },
    3 * READY_MILLIS,
  )
})
