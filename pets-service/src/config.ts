import {
  EnvError,
  databaseUrlFromEnv,
  drainMillisFromEnv,
  internalTokenFromEnv,
  listenHostFromEnv,
  listenersCollideProblem,
  maxConnectionsFromEnv,
  poolSizeFromEnv,
  portFromEnv,
  previousInternalTokenFromEnv,
} from '../../common/src/env.ts'

export interface PetsServiceConfig {
  databaseUrl: string
  /** DATABASE_POOL_SIZE: the most Postgres connections this process opens. */
  poolSize: number
  host: string
  port: number
  opsHost: string
  opsPort: number
  internalToken: string
  /** INTERNAL_TOKEN_PREVIOUS: accepted too while the credential is rotated. */
  previousInternalToken?: string
  /** SHUTDOWN_DRAIN_SECONDS: the drain before the listener closes on SIGTERM. */
  drainMillis: number
  /** PETS_MAX_CONNECTIONS: client connections the public port holds at once; unset, derived from the open-file limit. */
  maxConnections?: number
}

/** Environment only (see the README's table); a missing or malformed value stops the boot. */
export function loadPetsConfig(env: NodeJS.ProcessEnv = process.env): PetsServiceConfig {
  const listeners = {
    host: listenHostFromEnv('PETS_HOST', '127.0.0.1', env),
    port: portFromEnv('PETS_PORT', 3001, env),
    opsHost: listenHostFromEnv('PETS_OPS_HOST', '127.0.0.1', env),
    opsPort: portFromEnv('PETS_OPS_PORT', 9465, env),
  }
  const collision = listenersCollideProblem(
    { host: listeners.host, port: listeners.port, portName: 'PETS_PORT' },
    { host: listeners.opsHost, port: listeners.opsPort, portName: 'PETS_OPS_PORT' },
  )
  if (collision) throw new EnvError(collision)
  return Object.freeze({
    databaseUrl: databaseUrlFromEnv(env),
    poolSize: poolSizeFromEnv(env),
    ...listeners,
    internalToken: internalTokenFromEnv(env),
    previousInternalToken: previousInternalTokenFromEnv(env),
    drainMillis: drainMillisFromEnv(env),
    maxConnections: maxConnectionsFromEnv('PETS_MAX_CONNECTIONS', undefined, env),
  })
}
