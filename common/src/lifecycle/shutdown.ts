import type { Logger } from 'pino'

export interface ShutdownStep {
  name: string
  run: () => Promise<unknown>
}

/**
 * On SIGTERM or SIGINT runs the steps in order (stop accepting, drain, close pools) and exits.
 * A second signal or the deadline forces the exit so a stuck drain cannot hang a deploy.
 */
export function onShutdownSignal(logger: Logger, steps: ShutdownStep[], deadlineMillis = 15_000): void {
  let stopping = false
  const shutdown = async (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn({ signal }, 'second signal, exiting now')
      process.exit(1)
    }
    stopping = true
    logger.info({ signal }, 'shutting down')
    const deadline = setTimeout(() => {
      logger.error({ deadlineMillis }, 'shutdown deadline passed, exiting')
      process.exit(1)
    }, deadlineMillis)
    deadline.unref()
    let failed = false
    for (const step of steps) {
      try {
        await step.run()
      } catch (error) {
        failed = true
        logger.error({ err: error, step: step.name }, 'shutdown step failed')
      }
    }
    logger.info('stopped')
    process.exit(failed ? 1 : 0)
  }
  process.once('SIGTERM', (signal) => void shutdown(signal))
  process.on('SIGINT', (signal) => void shutdown(signal))
}
