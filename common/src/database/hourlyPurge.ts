import type { Logger } from 'pino'
import { isQueryCanceled } from './pool.ts'

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

/** The smallest batch deleteInBatches halves down to before it gives up until the next run. */
const MIN_BATCH_ROWS = 100

/**
 * Deletes in batches, each its own statement under the statement timeout, until one deletes fewer
 * rows than it was asked for; returns the rows deleted. `deleteBatch` deletes at most `rows` and
 * returns how many, carrying its own cursor from one batch to the next. A batch the statement
 * timeout cancels (a loaded or slow database) is tried again at half the size, down to 100 rows;
 * one cancelled at that size fails the run.
 */
export async function deleteInBatches(batchRows: number, deleteBatch: (rows: number) => Promise<number>): Promise<number> {
  let deletedInAll = 0
  for (let rows = batchRows; ; ) {
    let deleted: number
    try {
      deleted = await deleteBatch(rows)
    } catch (error) {
      if (!isQueryCanceled(error) || rows <= MIN_BATCH_ROWS) throw error
      rows = Math.max(Math.floor(rows / 2), MIN_BATCH_ROWS)
      continue
    }
    deletedInAll += deleted
    if (deleted < rows) return deletedInAll
  }
}
