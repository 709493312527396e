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
