import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import { pino } from 'pino'
import type pg from 'pg'
import { Registry } from 'prom-client'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { watchPostgresRefusals } from '../../common/src/database/privileges.ts'
import { connectionsHaveOwnSessions } from '../../common/src/database/sessions.ts'
import { buildPetsService } from '../../pets-service/src/app.ts'
import { PETS_MIGRATIONS, PETS_POSTGRES_NEEDS } from '../../pets-service/src/migrations.ts'
import { createPetRepository } from '../../pets-service/src/repository/petRepository.ts'

export const TEST_INTERNAL_TOKEN = 'test-internal-token-0123456789abcdef'

export interface RunningPetsService {
  app: FastifyInstance
  pool: pg.Pool
  /** The service's own metrics (what its /metrics would serve). */
  registry: Registry
  /** Base URL of the real HTTP listener, e.g. http://127.0.0.1:41234 */
  url: string
  /** fetch against the service with the internal credential unless `headers` overrides it. */
  request(pathAndQuery: string, init?: RequestInit): Promise<Response>
  close(): Promise<void>
}

/** Starts the pets-service on an ephemeral port against `databaseUrl`, migrations applied, trusting `internalToken` (TEST_INTERNAL_TOKEN by default). */
export async function startPetsService(
  databaseUrl: string,
  options: { logStream?: NodeJS.WritableStream; internalToken?: string; previousInternalToken?: string } = {},
): Promise<RunningPetsService> {
  const internalToken = options.internalToken ?? TEST_INTERNAL_TOKEN
  const registry = new Registry()
  const pool = createPool({ connectionString: databaseUrl, applicationName: 'pets-service-test' })
  await migrate(pool, PETS_MIGRATIONS)
  const logger = options.logStream ? pino(options.logStream) : pino({ level: 'silent' })
  const app = await buildPetsService({
    pets: createPetRepository(pool, { preparedStatements: await connectionsHaveOwnSessions(pool) }),
    internalToken,
    previousInternalToken: options.previousInternalToken,
    logger,
    registry,
    // As main.ts has it: Postgres refusing the role, or unavailable, said once per episode or minute.
    postgresRefusals: watchPostgresRefusals(pool, PETS_POSTGRES_NEEDS, logger),
  })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = app.server.address() as AddressInfo
  const url = `http://127.0.0.1:${port}`
  return {
    app,
    pool,
    registry,
    url,
    request: (pathAndQuery, init = {}) =>
      fetch(`${url}${pathAndQuery}`, {
        ...init,
        headers: { 'x-internal-token': internalToken, ...(init.headers as Record<string, string>) },
      }),
    async close() {
      await app.close()
      await pool.end()
    },
  }
}

/** POST /pets with a JSON body and the internal credential. */
export function jsonPost(body: unknown, headers: Record<string, string> = {}): RequestInit {
  return {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  }
}
