import { statSync, unwatchFile, watchFile } from 'node:fs'
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

const WATCH_INTERVAL_MILLIS = 500

export function createConfigSource(
  path: string,
  env: NodeJS.ProcessEnv,
  logger: Logger,
  onReload?: (outcome: 'success' | 'failure', config: GatewayConfig) => void,
): ConfigSource {
  const modifiedAt = () => {
    try {
      return statSync(path).mtimeMs
    } catch {
      return undefined
    }
  }
  // The file's modification time when it was last read, valid or not.
  let readAt = modifiedAt()
  let current = loadGatewayConfig(path, env)

  const reload = (): boolean => {
    readAt = modifiedAt()
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
      watchFile(path, { interval: WATCH_INTERVAL_MILLIS }, onChange)
      // watchFile takes its first stat asynchronously and compares later ones with it: a change
      // made after the last read but before that first stat would never be seen. One comparison
      // with the last read's modification time, once the watcher has its baseline, closes that gap.
      const firstCheck = setTimeout(() => {
        if (modifiedAt() !== readAt) reload()
      }, WATCH_INTERVAL_MILLIS)
      firstCheck.unref()
      return () => {
        clearTimeout(firstCheck)
        process.off('SIGHUP', onSignal)
        unwatchFile(path, onChange)
      }
    },
  }
}
