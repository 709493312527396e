import path from 'node:path'
import { freePort, startChildServer } from '../lib/childServer.ts'
import { FIRST_PAGE_PATH, FIRST_PAGE_REQUEST, checkFirstPetsPage } from './petsPage.ts'
import type { BenchTarget } from './types.ts'

/** bench/servers/minimalPets.ts: Fastify + pg and the same SQL, nothing else. */
export const minimalPetsTarget: BenchTarget = {
  id: 'minimal-pets',
  label: 'minimal Fastify + pg',
  request: FIRST_PAGE_REQUEST,
  description:
    'bench/servers/minimalPets.ts in its own process: one Fastify route, pg.Pool max 10, the same first-page ' +
    'SQL (LIMIT 21), reply.send(rows.slice(0, 20)); no validation, hooks, auth, metrics, response schema or logging.',
  checkResponse: checkFirstPetsPage,
  async start(context) {
    const port = await freePort()
    const url = `http://127.0.0.1:${port}${FIRST_PAGE_PATH}`
    const server = await startChildServer({
      name: 'minimal-pets',
      script: 'bench/servers/minimalPets.ts',
      nodeArgs: context.nodeArgs,
      env: { DATABASE_URL: context.databaseUrl, PORT: String(port), HOST: '127.0.0.1' },
      readyUrl: url,
      logFile: path.join(context.logDir, 'minimal-pets.log'),
    })
    return { url, headers: {}, pids: [server.pid], failure: server.exitReason, stop: () => server.stop() }
  },
}
