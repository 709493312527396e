/**
 * The worker thread's side of startEmbeddedPostgresInThread: starts the embedded database with the
 * options it was given, reports where it answers, a PANIC, and stops it when asked.
 */
import { inspect } from 'node:util'
import { parentPort, workerData } from 'node:worker_threads'
import { startEmbeddedPostgres, type EmbeddedPostgresOptions } from './embeddedPostgres.ts'
import type { FromEmbeddedThread, ToEmbeddedThread } from './embeddedPostgresThread.ts'

const parent = parentPort!
const send = (message: FromEmbeddedThread) => parent.postMessage(message)
// PGlite rejects with plain objects at times: words, never "[object Object]".
const messageOf = (error: unknown) => (error instanceof Error ? error.message : inspect(error, { depth: 3, breakLength: Infinity }))

try {
  const database = await startEmbeddedPostgres({
    ...(workerData as EmbeddedPostgresOptions),
    onPanic: (message) => send({ kind: 'panic', message }),
  })
  parent.on('message', (message: ToEmbeddedThread) => {
    if (message.kind !== 'stop') return
    database.stop().then(
      () => send({ kind: 'stopped' }),
      (error: unknown) => send({ kind: 'stop-failed', message: messageOf(error) }),
    )
  })
  send({ kind: 'started', url: database.url })
} catch (error) {
  send({ kind: 'failed', message: messageOf(error) })
}
