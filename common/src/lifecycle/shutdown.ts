import type { Logger } from 'pino'
import { watchLauncher } from './launcher.ts'

export interface ShutdownStep {
  name: string
  run: () => Promise<unknown>
  /**
   * How long the step may take before the shutdown goes on without it: for steps that wait on a
   * dependency's answer (closing a Postgres or Redis connection waits for the server), which a
   * hung server never gives. Nothing is lost by going on: the process is about to exit.
   */
  boundMillis?: number
}

/** The bound for closing a connection to a dependency: ample for a server that answers. */
export const CLOSE_DEPENDENCY_MILLIS = 1_000

/** What closing may take after the drain: in-flight requests, then the pools (the default deadline). */
export const SHUTDOWN_DEADLINE_AFTER_DRAIN_MILLIS = 15_000

export interface ShutdownOptions {
  /** The deadline after which the exit is forced (15 s; a service with a drain adds its length). */
  deadlineMillis?: number
  /**
   * The npm script that runs this service directly (`start:gateway`): while it is the one running,
   * npm exiting stops the service too. npm passes SIGTERM only to the shell it started (the
   * service would be left running, orphaned) and SIGHUP to nobody; see launcher.ts.
   */
  npmScript?: string
  /**
   * The start watch this takes over from (exitWhenStoppedWhileStarting's stop), stopped once the
   * shutdown's own listeners are in place. Removing the last SIGTERM listener stops Node watching
   * for the signal, and a SIGTERM already caught but not yet handled is dropped: stopped first,
   * the watch lost a SIGTERM that came as the service began listening, and the service ran on.
   */
  replaces?: () => void
}

/**
 * On SIGTERM or SIGINT runs the steps in order (stop accepting, drain, close pools) and exits.
 * A second signal or the deadline forces the exit so a stuck drain cannot hang a deploy.
 */
export function onShutdownSignal(logger: Logger, steps: ShutdownStep[], options: ShutdownOptions = {}): void {
  const deadlineMillis = options.deadlineMillis ?? SHUTDOWN_DEADLINE_AFTER_DRAIN_MILLIS
  let stopping = false
  const shutdown = async (cause: { signal: NodeJS.Signals } | { launcher: string }) => {
    if (stopping) {
      logger.warn(cause, 'second signal, exiting now')
      process.exit(1)
    }
    stopping = true
    logger.info(cause, 'shutting down')
    const deadline = setTimeout(() => {
      logger.error({ deadlineMillis }, 'shutdown deadline passed, exiting')
      process.exit(1)
    }, deadlineMillis)
    deadline.unref()
    let failed = false
    for (const step of steps) {
      try {
        if (step.boundMillis === undefined) await step.run()
        else if (!(await finishedWithin(step.run(), step.boundMillis))) {
          logger.warn({ step: step.name, boundMillis: step.boundMillis }, 'shutdown step did not finish in time (a dependency not answering); going on')
        }
      } catch (error) {
        failed = true
        logger.error({ err: error, step: step.name }, 'shutdown step failed')
      }
    }
    logger.info('stopped')
    process.exit(failed ? 1 : 0)
  }
  process.on('SIGTERM', (signal) => void shutdown({ signal }))
  process.on('SIGINT', (signal) => void shutdown({ signal }))
  options.replaces?.()
  if (options.npmScript !== undefined && process.env.npm_lifecycle_event === options.npmScript) {
    watchLauncher((launcher) => {
      if (!stopping) void shutdown({ launcher: `${launcher} exited` })
    })
  }
}

/** Whether `work` settles within `millis` (its rejection is thrown); it is not waited for past that. */
async function finishedWithin(work: Promise<unknown>, millis: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), millis)))
  try {
    return await Promise.race([work.then(() => true as const), late])
  } finally {
    clearTimeout(timer)
  }
}

/**
 * Until onShutdownSignal takes over, a service that is still starting (it may wait for Postgres
 * for long) stops at once when asked:
 * - on SIGTERM or SIGINT: as PID 1 in a container without an init process, a signal without a
 *   handler is dropped, so `docker stop` or the kubelet would wait out its grace period;
 * - when npm goes away, under its npm script: a service waiting for Postgres would otherwise be
 *   left orphaned and start serving, holding its ports, once Postgres appeared.
 * Nothing is served yet, so there is nothing to drain. Returns the stop of these watches.
 */
export function exitWhenStoppedWhileStarting(logger: Logger, npmScript: string): () => void {
  const onSignal = (signal: NodeJS.Signals) => {
    logger.info({ signal }, 'stopped while starting')
    process.exit(0)
  }
  process.on('SIGTERM', onSignal)
  process.on('SIGINT', onSignal)
  const stopLauncherWatch =
    process.env.npm_lifecycle_event === npmScript
      ? watchLauncher((launcher) => {
          logger.warn({ launcher: `${launcher} exited` }, 'launcher gone while starting, exiting')
          process.exit(1)
        })
      : () => undefined
  return () => {
    process.off('SIGTERM', onSignal)
    process.off('SIGINT', onSignal)
    stopLauncherWatch()
  }
}
