import type { Logger } from 'pino'

const HOUR_MILLIS = 3_600_000

/**
 * Runs `purge` now and then every hour, logging how many rows it removed and any failure (the
 * next run tries again). At start too: a service restarted more often than hourly would otherwise
 * never purge. Returns the function that stops it, for the shutdown steps.
 */
export function purgeHourly(what: string, purge: () => Promise<number>, logger: Logger): () => void {
  const run = () =>
    void purge().then(
      (purged) => purged > 0 && logger.info({ purged }, `${what} purged`),
      (error: unknown) => logger.warn({ err: error }, `${what}: purge failed`),
    )
  run()
  const timer = setInterval(run, HOUR_MILLIS)
  timer.unref()
  return () => clearInterval(timer)
}
