import { Worker } from 'node:worker_threads'
import type { EmbeddedPostgres, EmbeddedPostgresOptions } from './embeddedPostgres.ts'

export type ToEmbeddedThread = { kind: 'stop' }
export type FromEmbeddedThread =
  | { kind: 'started'; url: string }
  | { kind: 'failed'; message: string }
  | { kind: 'panic'; message: string }
  | { kind: 'stopped' }
  | { kind: 'stop-failed'; message: string }

export interface EmbeddedPostgresThread extends EmbeddedPostgres {
  /** Asks the database to close cleanly; past `millis`, ends its thread instead and rejects. */
  stop(millis?: number): Promise<void>
}

export interface EmbeddedPostgresThreadOptions extends Omit<EmbeddedPostgresOptions, 'onPanic'> {
  /**
   * The database is gone: it panicked (the message says why) or its thread ended. Nothing it was
   * asked after that will be answered.
   */
  onFailure(message: string): void
}

const DEFAULT_STOP_MILLIS = 10_000

/**
 * A worker thread gets no module hooks of its parent's (`--import tsx` is not run in it on Node 20),
 * so it loads the TypeScript entry through tsx's own API.
 */
const WORKER_BOOTSTRAP = `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then(({ tsImport }) =>
  tsImport(${JSON.stringify(new URL('./embeddedPostgresWorker.ts', import.meta.url).href)}, ${JSON.stringify(import.meta.url)}))`

/**
 * startEmbeddedPostgres on a worker thread of its own. PGlite runs Postgres's code on the thread
 * that calls it, and after a PANIC (a full disk under its write-ahead log) that thread spins for
 * ever: on the main thread, no signal handler, timer or stop ran again, so Ctrl-C did nothing and
 * the stack served 503s until killed. On a thread of its own, the process still hears signals,
 * learns of the PANIC as it happens, and can end the thread.
 */
export function startEmbeddedPostgresInThread(options: EmbeddedPostgresThreadOptions): Promise<EmbeddedPostgresThread> {
  const { onFailure, ...databaseOptions } = options
  const worker = new Worker(WORKER_BOOTSTRAP, { eval: true, workerData: databaseOptions })
  let state: 'starting' | 'running' | 'stopping' | 'gone' = 'starting'
  let stopped: ((failure?: string) => void) | undefined

  return new Promise<EmbeddedPostgresThread>((resolve, reject) => {
    const gone = (message: string) => {
      const was = state
      state = 'gone'
      if (was === 'starting') reject(new Error(message))
      else if (was === 'running') onFailure(message)
      else stopped?.(message)
    }
    worker.on('message', (message: FromEmbeddedThread) => {
      switch (message.kind) {
        case 'started':
          state = 'running'
          resolve(handle(message.url))
          return
        case 'failed':
          void worker.terminate()
          gone(message.message)
          return
        case 'panic':
          // The thread is spinning now; nothing more comes from it.
          void worker.terminate()
          gone(`PANIC: ${message.message}`)
          return
        case 'stopped':
          state = 'gone'
          void worker.terminate()
          stopped?.()
          return
        case 'stop-failed':
          state = 'gone'
          void worker.terminate()
          stopped?.(message.message)
      }
    })
    worker.on('error', (error) => gone(`its thread failed: ${error.message}`))
    worker.on('exit', (code) => {
      if (state !== 'gone') gone(`its thread ended (exit code ${code})`)
    })
  })

  function handle(url: string): EmbeddedPostgresThread {
    let stopping: Promise<void> | undefined
    return {
      url,
      stop(millis = DEFAULT_STOP_MILLIS) {
        // Already reported to onFailure: nothing is left to close.
        if (state === 'gone') return stopping ?? Promise.resolve()
        // A second call shares the first's stop.
        if (stopping) return stopping
        state = 'stopping'
        return (stopping = new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => {
            state = 'gone'
            void worker.terminate()
            reject(new Error(`it did not close within ${millis / 1000} s; its thread was ended`))
          }, millis)
          stopped = (failure) => {
            clearTimeout(timer)
            if (failure === undefined) resolve()
            else reject(new Error(failure))
          }
          worker.postMessage({ kind: 'stop' } satisfies ToEmbeddedThread)
        }))
      },
    }
  }
}
