import { chmod, mkdir, rm } from 'node:fs/promises'
import type { Server, Socket } from 'node:net'
import path from 'node:path'
import { PGlite } from '@electric-sql/pglite'
import { PGLiteSocketServer } from '@electric-sql/pglite-socket'

export interface EmbeddedPostgresOptions {
  /** Folder for the data files; in memory when omitted (tests). */
  dataDir?: string
  host?: string
  /**
   * Serve on the Unix socket `<socketDirectory>/.s.PGSQL.<port>` (libpq's name, so `psql -h <dir>
   * -p <port>` and pg with `host` = the directory reach it) instead of TCP. The directory is the
   * access control: it must be private to this user, and this process's alone (a socket file left
   * there by a run that was killed is removed).
   */
  socketDirectory?: string
  /** TCP: 0 picks a free port. With socketDirectory: the number in the socket's name (default 5432). */
  port?: number
  /** PGlite is one backend; the socket server multiplexes this many client connections onto it. */
  maxConnections?: number
  /**
   * Told the message of a PANIC the database sends a client (a write-ahead-log write that failed on
   * a full disk, say). PGlite does not survive one: the thread running it then spins for ever
   * inside the call that panicked, so this is the last thing that thread does.
   */
  onPanic?: (message: string) => void
}

export interface EmbeddedPostgres {
  url: string
  stop(): Promise<void>
}

/** Longest Unix socket path the system takes (sun_path less its NUL: Linux 108 bytes, macOS and the BSDs 104). */
export const SOCKET_PATH_MAX_BYTES = process.platform === 'linux' ? 107 : 103

/** Where libpq and pg look for a server on `port` whose socket is in `directory`. */
export function socketPath(directory: string, port: number): string {
  return path.join(directory, `.s.PGSQL.${port}`)
}

/**
 * The URL of the server on a socket directory, in the form pg, libpq (psql) and the WHATWG parser
 * all take: no host in the authority, the directory in `host`. The slashes stay readable.
 */
export function socketUrl(directory: string, port: number): string {
  const host = encodeURIComponent(directory).replaceAll('%2F', '/')
  return `postgres:///postgres?host=${host}&port=${port}&user=postgres&sslmode=disable`
}

/**
 * PGlite (Postgres compiled to WebAssembly) served over the Postgres wire protocol, so the
 * services use the very same `pg` code path as against a real server.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions = {}): Promise<EmbeddedPostgres> {
  if (options.dataDir) await mkdir(options.dataDir, { recursive: true })
  const db = await PGlite.create(options.dataDir ? { dataDir: options.dataDir } : {})
  const host = options.host ?? '127.0.0.1'
  const directory = options.socketDirectory
  const listenPath = directory === undefined ? undefined : socketPath(directory, options.port ?? 5432)
  const maxConnections = options.maxConnections ?? 32
  const server = new PGLiteSocketServer(
    listenPath === undefined
      ? { db, host, port: options.port ?? 0, maxConnections }
      : { db, path: listenPath, maxConnections },
  )
  keepBatchesTogether(server, db, options.onPanic)
  try {
    if (listenPath !== undefined) {
      if (Buffer.byteLength(listenPath) > SOCKET_PATH_MAX_BYTES) {
        throw new Error(`the socket path ${listenPath} is longer than the ${SOCKET_PATH_MAX_BYTES} bytes the system takes`)
      }
      await rm(listenPath, { force: true })
    }
    await server.start()
    // The private directory already keeps others out; the socket's own mode says so too.
    if (listenPath !== undefined) await chmod(listenPath, 0o600)
  } catch (error) {
    await server.stop().catch(() => undefined)
    await db.close().catch(() => undefined)
    throw error
  }
  const connections = openConnections(server)
  const address = server.getServerConn()
  return {
    url:
      directory === undefined
        ? `postgres://postgres@${host}:${Number(address.split(':').at(-1))}/postgres?sslmode=disable`
        : socketUrl(directory, options.port ?? 5432),
    async stop() {
      const stopped = server.stop()
      // Every connection ends here, as in Postgres's fast shutdown. The server closes once its last
      // connection has, and pglite-socket closes only those its handlers hold: one it accepted as it
      // stopped it only half-closes, and such a connection held npm start's stop until the client
      // let go (past npm start's 10 s bound, now and then, in the suite).
      for (const socket of connections) socket.destroy()
      await stopped
      await db.close()
    },
  }
}

/** The sockets the server has accepted and not yet closed, its handlers' or not. */
function openConnections(server: PGLiteSocketServer): Set<Socket> {
  const listener = (server as unknown as { server: Server | null }).server
  const sockets = new Set<Socket>()
  listener?.on('connection', (socket: Socket) => {
    sockets.add(socket)
    socket.once('close', () => sockets.delete(socket))
  })
  return sockets
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
function keepBatchesTogether(server: PGLiteSocketServer, db: PGlite, onPanic?: (message: string) => void): void {
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
        const watch = onPanic && panicWatcher()
        try {
          await db.runExclusive(() =>
            db.execProtocolRawStream(item.message, {
              onRawData: (data: Uint8Array) => {
                bytes += data.length
                item.onData(data)
                const panic = watch?.(data)
                if (panic !== undefined) onPanic?.(panic)
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

/** The most of an ErrorResponse gathered to read its severity; a longer one is no PANIC of PGlite's. */
const LONGEST_ERROR_BYTES = 65_536

/**
 * Watches what PGlite writes to a client for one protocol message, in whatever pieces its output
 * buffer gave, for a PANIC ErrorResponse: returns the PANIC's message once that ErrorResponse is
 * whole. A message is 'E' or another type byte, a length (itself included), and its body; an
 * ErrorResponse's body is fields of one type byte and a NUL-terminated text each, 'V' the severity
 * never translated, 'M' the message.
 */
export function panicWatcher(): (data: Uint8Array) => string | undefined {
  let header = Buffer.alloc(0)
  let skip = 0
  let error: Buffer | undefined
  let gathered = 0
  return (data) => {
    const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
    for (let at = 0; at < bytes.length; ) {
      if (skip > 0) {
        const taken = Math.min(skip, bytes.length - at)
        skip -= taken
        at += taken
      } else if (error !== undefined) {
        const taken = Math.min(error.length - gathered, bytes.length - at)
        bytes.copy(error, gathered, at, at + taken)
        gathered += taken
        at += taken
        if (gathered === error.length) {
          const panic = panicIn(error)
          error = undefined
          if (panic !== undefined) return panic
        }
      } else {
        const taken = bytes.subarray(at, at + 5 - header.length)
        header = header.length === 0 ? Buffer.from(taken) : Buffer.concat([header, taken])
        at += taken.length
        if (header.length < 5) break
        const body = header.readInt32BE(1) - 4
        const isError = header[0] === 0x45
        header = Buffer.alloc(0)
        // Not the protocol (a length below its own): nothing more of this can be read.
        if (body < 0) skip = Number.POSITIVE_INFINITY
        else if (isError && body > 0 && body <= LONGEST_ERROR_BYTES) {
          error = Buffer.alloc(body)
          gathered = 0
        } else skip = body
      }
    }
    return undefined
  }
}

/** The message of an ErrorResponse's fields when its severity is PANIC. */
function panicIn(fields: Buffer): string | undefined {
  const found = new Map<number, string>()
  for (let at = 0; at < fields.length && fields[at] !== 0; ) {
    const end = fields.indexOf(0, at + 1)
    if (end === -1) break
    found.set(fields[at]!, fields.toString('utf8', at + 1, end))
    at = end + 1
  }
  return found.get(0x56) === 'PANIC' ? (found.get(0x4d) ?? 'PANIC') : undefined
}
