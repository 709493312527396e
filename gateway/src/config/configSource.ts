import { statSync } from 'node:fs'
import type { Logger } from 'pino'
import { versionOf, watchFiles } from './fileWatch.ts'
import { ConfigError, loadGatewayConfig, type GatewayConfig } from './loadConfig.ts'

export interface ConfigSource {
  /** The config in force; replaced as a whole, never mutated. */
  get(): GatewayConfig
  /** Reads and validates the file again; an invalid file keeps the running config. */
  reload(): boolean
  /** Reloads on SIGHUP and when the file changes; returns a function that stops watching. */
  watch(): () => void
}

/**
 * How long a file found missing or empty is given to come back before a reload reads it. Tools
 * that replace a file pass through those states (an editor truncating then writing, `rm` then
 * `cp`, a directory swapped by two renames); read then, each would be a refused reload, an error
 * line and the ConfigReloadFailed alert, with the final file valid and in force.
 */
const SETTLE_MILLIS = 2_000

/**
 * The sections the gateway reads once, at start: listeners and trusted proxies (the Fastify
 * server), upstreams (the proxy routes), the key cache, onStoreFailure and redis (the limiter's
 * stores). Plans, windows, bans, anonymous and openapi are read per request and follow a reload.
 */
const RESTART_ONLY = ['server', 'upstreams', 'keyCache', 'onStoreFailure', 'redis'] as const

/** Resolved names that differ from the file's (the file says seconds, the gateway keeps millis). */
const FILE_NAMES: Readonly<Record<string, string>> = {
  'keyCache.ttlMillis': 'keyCache.ttlSeconds',
  'keyCache.negativeTtlMillis': 'keyCache.negativeTtlSeconds',
  'upstreams.pets.timeoutMillis': 'upstreams.pets.timeoutSeconds',
  'upstreams.orders.timeoutMillis': 'upstreams.orders.timeoutSeconds',
}

/** The restart-only settings (as the config file names them) whose value a reload changed. */
export function restartOnlyChanges(before: GatewayConfig, after: GatewayConfig): string[] {
  const changed: string[] = []
  const compare = (path: string, a: unknown, b: unknown) => {
    const isObject = (value: unknown) => value !== null && typeof value === 'object' && !Array.isArray(value)
    if (isObject(a) && isObject(b)) {
      const keys = new Set([...Object.keys(a as object), ...Object.keys(b as object)])
      for (const key of keys) compare(`${path}.${key}`, (a as Record<string, unknown>)[key], (b as Record<string, unknown>)[key])
    } else if (JSON.stringify(a) !== JSON.stringify(b)) {
      changed.push(FILE_NAMES[path] ?? path)
    }
  }
  for (const section of RESTART_ONLY) compare(section, before[section], after[section])
  return changed
}

export function createConfigSource(
  path: string,
  env: NodeJS.ProcessEnv,
  logger: Logger,
  onReload?: (outcome: 'success' | 'failure', config: GatewayConfig) => void,
): ConfigSource {
  const stats = () => {
    try {
      return statSync(path)
    } catch {
      return undefined
    }
  }
  const version = () => versionOf([path])
  // Which version of the file was last read, valid or not.
  let readAt = version()
  let current = loadGatewayConfig(path, env)
  // What the restart-only settings are in this process, whatever the file says later.
  const started = current

  const reload = (): boolean => {
    readAt = version()
    try {
      const previous = current
      // server.tls's files rotate on their own (tlsRotation.ts): a pair mid-replacement must not
      // hold back a change of plans, nor a plan change count as a certificate rotation. Files other
      // than those in force (taken at the next start) are read: a reload that names files the next
      // start cannot read was counted a success, and the gateway then did not start again.
      current = loadGatewayConfig(path, env, undefined, { tlsFiles: false, tlsInForce: started.server.tls })
      logger.info({ path }, 'gateway config reloaded')
      // Changed by this reload and not what runs: an edit put back to the running value is no news.
      const differFromRunning = new Set(restartOnlyChanges(started, current))
      const settings = restartOnlyChanges(previous, current).filter((setting) => differFromRunning.has(setting))
      if (settings.length > 0) {
        logger.warn(
          { path, settings },
          `gateway config: ${settings.join(', ')} changed but take${settings.length === 1 ? 's' : ''} effect only at the next start`,
        )
      }
      onReload?.('success', current)
      return true
    } catch (error) {
      const problems = error instanceof ConfigError ? error.problems : [String(error)]
      logger.error({ path, problems }, 'gateway config reload refused; the running config stays')
      onReload?.('failure', current)
      return false
    }
  }

  // A reload put off while the file was missing or empty (SETTLE_MILLIS).
  let settling: NodeJS.Timeout | undefined
  /** Reloads now, or once the file had SETTLE_MILLIS to come back if it is missing or empty: then it counts, either way. */
  const reloadOnceSettled = () => {
    const found = stats()
    if (found === undefined || found.size === 0) {
      if (settling === undefined) {
        logger.info({ path }, `gateway config file is missing or empty; read again in ${SETTLE_MILLIS} ms (a tool replacing it?)`)
        settling = setTimeout(() => {
          settling = undefined
          reload()
        }, SETTLE_MILLIS)
        settling.unref()
      }
      return
    }
    clearTimeout(settling)
    settling = undefined
    reload()
  }

  return {
    get: () => current,
    reload,
    watch() {
      const onSignal = () => reloadOnceSettled()
      process.on('SIGHUP', onSignal)
      const stopWatching = watchFiles([path], () => readAt, reloadOnceSettled)
      return () => {
        stopWatching()
        clearTimeout(settling)
        process.off('SIGHUP', onSignal)
      }
    },
  }
}
