import { mkdir } from 'node:fs/promises'
import { PGlite } from '@electric-sql/pglite'
import { PGLiteSocketServer } from '@electric-sql/pglite-socket'

export interface EmbeddedPostgresOptions {
  /** Folder for the data files; in memory when omitted (tests). */
  dataDir?: string
  host?: string
  /** 0 picks a free port. */
  port?: number
  /** PGlite is one backend; the socket server multiplexes this many client connections onto it. */
  maxConnections?: number
}

export interface EmbeddedPostgres {
  url: string
  stop(): Promise<void>
}

/**
 * PGlite (Postgres compiled to WebAssembly) served over the Postgres wire protocol, so the
 * services use the very same `pg` code path as against a real server.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions = {}): Promise<EmbeddedPostgres> {
  if (options.dataDir) await mkdir(options.dataDir, { recursive: true })
  const db = await PGlite.create(options.dataDir ? { dataDir: options.dataDir } : {})
  const host = options.host ?? '127.0.0.1'
  const server = new PGLiteSocketServer({
    db,
    host,
    port: options.port ?? 0,
    maxConnections: options.maxConnections ?? 32,
  })
  keepBatchesTogether(server, db)
  try {
    await server.start()
  } catch (error) {
    await db.close().catch(() => undefined)
    throw error
  }
  const address = server.getServerConn()
  const port = Number(address.split(':').at(-1))
  return {
    url: `postgres://postgres@${host}:${port}/postgres?sslmode=disable`,
    async stop() {
      await server.stop()
      await db.close()
    },
  }
}

interface QueuedMessage {
  handlerId: number
  message: Uint8Array
  resolve(bytes: number): void
  reject(error: unknown): void
  onData(data: Uint8Array): void
}

/**
 * pglite-socket 0.2.x serialises single protocol messages from every connection onto PGlite's one
 * session and keeps a connection's messages together only while a transaction is open. An
 * extended-protocol batch (Parse/Bind/Describe/Execute … Sync) is not a transaction, so two
 * connections' batches interleaved and bound each other's unnamed statement and portal: wrong rows
 * or errors (electric-sql/pglite#1046). Here a connection keeps the session from its first message
 * until the end of its batch (Sync or a simple Query) and, as before, for a whole transaction.
 * The queue's own `lastHandlerId` is that owner, so its rollback of a transaction left open by a
 * connection that went away (clearTransactionIfNeeded) frees the session as before. A message
 * that fails no longer leaves the queue stuck (the original returned with `processing` set).
 */
function keepBatchesTogether(server: PGLiteSocketServer, db: PGlite): void {
  const queue = (
    server as unknown as {
      queryQueue: {
        queue: QueuedMessage[]
        processing: boolean
        lastHandlerId: number | null
        processQueue(): Promise<void>
        clearQueueForHandler(handlerId: number): void
      }
    }
  ).queryQueue
  // A connection that goes away in the middle of its batch must not hold the session.
  const clear = queue.clearQueueForHandler.bind(queue)
  queue.clearQueueForHandler = (handlerId: number) => {
    clear(handlerId)
    if (queue.lastHandlerId === handlerId && !db.isInTransaction()) {
      queue.lastHandlerId = null
      void queue.processQueue()
    }
  }
  queue.processQueue = async function processQueue(this: typeof queue) {
    if (this.processing || this.queue.length === 0) return
    this.processing = true
    try {
      while (this.queue.length > 0) {
        const owner = this.lastHandlerId
        const index = owner === null ? 0 : this.queue.findIndex((item) => item.handlerId === owner)
        if (index === -1) break
        const [item] = this.queue.splice(index, 1) as [QueuedMessage]
        const type = item.message[0]
        let bytes = 0
        try {
          await db.runExclusive(() =>
            db.execProtocolRawStream(item.message, {
              onRawData: (data: Uint8Array) => {
                bytes += data.length
                item.onData(data)
              },
            }),
          )
        } catch (error) {
          this.lastHandlerId = db.isInTransaction() ? item.handlerId : null
          item.reject(error)
          continue
        }
        // 'S' Sync and 'Q' Query end a batch; so do the startup message (no type byte) and 'X'.
        const endsBatch = type === 0x53 || type === 0x51 || type === 0x58 || type === 0
        this.lastHandlerId = db.isInTransaction() || !endsBatch ? item.handlerId : null
        item.resolve(bytes)
      }
    } finally {
      this.processing = false
    }
  }
}
