import { Registry } from 'prom-client'
import { collectProcessMetrics } from '../../common/src/ops/processMetrics.ts'
import { requireUtf8Database } from '../../common/src/database/encoding.ts'
import { migrate } from '../../common/src/database/migrate.ts'
import { createPool } from '../../common/src/database/pool.ts'
import { postgresAnswers, requirePostgresGrants, watchPostgresRefusals } from '../../common/src/database/privileges.ts'
import { waitForPostgres } from '../../common/src/database/waitForPostgres.ts'
import { connectionsHaveOwnSessions } from '../../common/src/database/sessions.ts'
import { purgeHourly } from '../../common/src/database/hourlyPurge.ts'
import { listenOrSay, reportStartupFailure, warnOfPublishedToken } from '../../common/src/env.ts'
import {
  CLOSE_DEPENDENCY_MILLIS,
  SHUTDOWN_DEADLINE_AFTER_DRAIN_MILLIS,
  exitWhenStoppedWhileStarting,
  onShutdownSignal,
} from '../../common/src/lifecycle/shutdown.ts'
import { checkLogLevel, createLogger } from '../../common/src/logger.ts'
import { capConnections, connectionBudget, openFileLimit } from '../../common/src/http/connectionCap.ts'
import { registerConnectionMetrics } from '../../common/src/ops/connectionMetrics.ts'
import { buildOpsServer } from '../../common/src/ops/opsServer.ts'
import { registerPoolMetrics } from '../../common/src/ops/poolMetrics.ts'
import { buildPetsService } from './app.ts'
import { loadPetsConfig } from './config.ts'
import { PETS_MIGRATIONS, PETS_POSTGRES_NEEDS } from './migrations.ts'
import { createPetRepository } from './repository/petRepository.ts'

const logger = createLogger('pets-service')

async function main(): Promise<void> {
  // Node's default for SIGHUP is to exit: one meant for the gateways' reload (`docker compose kill
  // -s HUP`, a config push to every service) cut the catalogue's requests short, unanswered.
  process.on('SIGHUP', () => logger.info('SIGHUP: the pets-service has no config to reload; it goes on serving'))
  const stopStartWatch = exitWhenStoppedWhileStarting(logger, 'start:pets')
  checkLogLevel()
  const config = loadPetsConfig()
  warnOfPublishedToken(config.internalToken, logger)
  const pool = createPool({ connectionString: config.databaseUrl, applicationName: 'pets-service', max: config.poolSize, logger })
  const registry = new Registry()
  collectProcessMetrics(registry)
  registerPoolMetrics(registry, pool)
  const postgresRefusals = watchPostgresRefusals(pool, PETS_POSTGRES_NEEDS, logger)

  // The ops port first: while Postgres is awaited the process is alive (/healthz) and not ready.
  let started = false
  let accepting = true
  const ops = buildOpsServer({
    registry,
    logger,
    isStarted: () => started,
    isAccepting: () => accepting,
    // Once started, a check of what requests need, not SELECT 1: a privilege taken from the role
    // leaves Postgres answering while every request is refused. Before, the schema may not exist yet.
    dependencies: { postgres: async () => void (started ? await postgresRefusals.probe() : await postgresAnswers(pool)) },
  })
  await listenOrSay(() => ops.listen({ host: config.opsHost, port: config.opsPort }), {
    host: config.opsHost,
    port: config.opsPort,
    hostSetting: 'PETS_OPS_HOST',
    portSetting: 'PETS_OPS_PORT',
  })

  await waitForPostgres(pool, logger)
  await requireUtf8Database(pool)
  await requirePostgresGrants(pool, PETS_POSTGRES_NEEDS, () => migrate(pool, PETS_MIGRATIONS, logger))
  const pets = createPetRepository(pool, { preparedStatements: await connectionsHaveOwnSessions(pool) })
  const app = await buildPetsService({ pets, internalToken: config.internalToken, previousInternalToken: config.previousInternalToken, logger, registry, postgresRefusals })

  capConnections(app.server, connectionBudget({
    configured: config.maxConnections,
    outboundConnections: config.poolSize,
    openFileLimit: openFileLimit(),
  }), logger, 'PETS_MAX_CONNECTIONS')
  registerConnectionMetrics(registry, { public: app.server, ops: ops.server })
  const stopPurge = purgeHourly('idempotency keys past their 24 h', () => pets.purgeIdempotencyKeys(), logger)

  await listenOrSay(() => app.listen({ host: config.host, port: config.port }), { host: config.host, port: config.port, hostSetting: 'PETS_HOST', portSetting: 'PETS_PORT' })
  started = true

  onShutdownSignal(logger, [
    { name: 'stop accepting', run: async () => (accepting = false) },
    { name: 'drain connections', run: () => app.drain(config.drainMillis) },
    { name: 'drain requests', run: () => app.close() },
    { name: 'stop purging', run: async () => stopPurge() },
    { name: 'close ops port', run: () => ops.close() },
    { name: 'close Postgres pool', run: () => pool.end(), boundMillis: CLOSE_DEPENDENCY_MILLIS },
  ], { npmScript: 'start:pets', replaces: stopStartWatch, deadlineMillis: config.drainMillis + SHUTDOWN_DEADLINE_AFTER_DRAIN_MILLIS })
}

main().catch((error: unknown) => {
  reportStartupFailure(logger, 'pets-service', error)
  process.exit(1)
})
