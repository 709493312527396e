import { unwatchFile, watchFile } from 'node:fs'
import type { Logger } from 'pino'
import { ConfigError, loadGatewayConfig, type GatewayConfig } from './loadConfig.ts'

export interface ConfigSource {
  /** The config in force; replaced as a whole, never mutated. */
  get(): GatewayConfig
  /** Reads and validates the file again; an invalid file keeps the running config. */
  reload(): boolean
  /** Reloads on SIGHUP and when the file changes; returns a function that stops watching. */
  watch(): () => void
}

export function createConfigSource(
  path: string,
  env: NodeJS.ProcessEnv,
  logger: Logger,
  onReload?: (outcome: 'success' | 'failure', config: GatewayConfig) => void,
): ConfigSource {
  let current = loadGatewayConfig(path, env)

  const reload = (): boolean => {
    try {
      current = loadGatewayConfig(path, env)
      logger.info({ path }, 'gateway config reloaded')
      onReload?.('success', current)
      return true
    } catch (error) {
      const problems = error instanceof ConfigError ? error.problems : [String(error)]
      logger.error({ path, problems }, 'gateway config reload refused; the running config stays')
      onReload?.('failure', current)
      return false
    }
  }

  return {
    get: () => current,
    reload,
    watch() {
      const onSignal = () => void reload()
      process.on('SIGHUP', onSignal)
      // Polling the file's stat survives editors that replace the file and bind mounts alike.
      const onChange = (now: { mtimeMs: number }, before: { mtimeMs: number }) => {
        if (now.mtimeMs !== before.mtimeMs) reload()
      }
      watchFile(path, { interval: 500 }, onChange)
      return () => {
        process.off('SIGHUP', onSignal)
        unwatchFile(path, onChange)
      }
    },
  }
}
