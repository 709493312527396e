import { randomBytes } from 'node:crypto'
import path from 'node:path'
import { freePort, startChildServer } from '../lib/childServer.ts'
import { FIRST_PAGE_PATH, FIRST_PAGE_REQUEST, checkFirstPetsPage } from './petsPage.ts'
import type { BenchTarget } from './types.ts'

interface PetsServiceVariant {
  id: string
  label: string
  /** `info` is what production pays: one log line per request. */
  logLevel: string
}

/** The real pets-service, started exactly like production: pets-service/src/main.ts. */
export function petsServiceTarget({ id, label, logLevel }: PetsServiceVariant): BenchTarget {
  return {
    id,
    label,
    request: FIRST_PAGE_REQUEST,
    description:
      'pets-service/src/main.ts in its own process (node --import tsx), ' +
      `LOG_LEVEL=${logLevel} with its log written to a file, the x-internal-token header on every request: ` +
      'the full pipeline (request id, one log line, metrics, internal auth, query validation, response schema, ' +
      'Link header).',
    checkResponse: checkFirstPetsPage,
    async start(context) {
      const [port, opsPort] = [await freePort(), await freePort()]
      const token = randomBytes(24).toString('hex')
      const url = `http://127.0.0.1:${port}${FIRST_PAGE_PATH}`
      const server = await startChildServer({
        name: id,
        script: 'pets-service/src/main.ts',
        nodeArgs: context.nodeArgs,
        env: {
          DATABASE_URL: context.databaseUrl,
          INTERNAL_TOKEN: token,
          PETS_HOST: '127.0.0.1',
          PETS_PORT: String(port),
          PETS_OPS_HOST: '127.0.0.1',
          PETS_OPS_PORT: String(opsPort),
          LOG_LEVEL: logLevel,
        },
        readyUrl: `http://127.0.0.1:${opsPort}/readyz`,
        logFile: path.join(context.logDir, `${id}.log`),
      })
      return {
        url,
        headers: { 'x-internal-token': token },
        pids: [server.pid],
        failure: server.exitReason,
        stop: () => server.stop(),
      }
    },
  }
}
