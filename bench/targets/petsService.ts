import { randomBytes } from 'node:crypto'
import path from 'node:path'
import { freePort, startChildServer } from '../lib/childServer.ts'
import { FIRST_PAGE_PATH, FIRST_PAGE_REQUEST, checkFirstPetsPage } from './petsPage.ts'
import type { BenchTarget, SharedService, TargetContext } from './types.ts'

interface PetsServiceVariant {
  id: string
  label: string
  /** `info` is what production pays: one log line per request. */
  logLevel: string
}

export interface PetsService extends SharedService {
  /** http://127.0.0.1:port, no path. */
  origin: string
  /** The x-internal-token it requires (a gateway in front of it gets the same INTERNAL_TOKEN). */
  internalToken: string
}

/**
 * pets-service/src/main.ts on the bench database, started once per run and id: the pets-service
 * row measures it directly, the full-stack row through a gateway in front of it.
 */
export function petsService(context: TargetContext, { id, logLevel }: Pick<PetsServiceVariant, 'id' | 'logLevel'>): Promise<PetsService> {
  return context.shared(`service:${id}`, async () => {
    const [port, opsPort] = [await freePort(), await freePort()]
    const internalToken = randomBytes(24).toString('hex')
    const server = await startChildServer({
      name: id,
      script: 'pets-service/src/main.ts',
      nodeArgs: context.nodeArgs,
      env: {
        DATABASE_URL: context.databaseUrl,
        INTERNAL_TOKEN: internalToken,
        PETS_HOST: '127.0.0.1',
        PETS_PORT: String(port),
        PETS_OPS_HOST: '127.0.0.1',
        PETS_OPS_PORT: String(opsPort),
        LOG_LEVEL: logLevel,
      },
      readyUrl: `http://127.0.0.1:${opsPort}/readyz`,
      logFile: path.join(context.logDir, `${id}.log`),
    })
    return { origin: `http://127.0.0.1:${port}`, internalToken, pid: server.pid, failure: server.exitReason, stop: () => server.stop() }
  })
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
      const service = await petsService(context, { id, logLevel })
      return {
        url: `${service.origin}${FIRST_PAGE_PATH}`,
        headers: { 'x-internal-token': service.internalToken },
        pids: [service.pid],
        failure: service.failure,
        // Shared with the full-stack row's gateway; the harness stops it once at the end.
        stop: async () => undefined,
      }
    },
  }
}
