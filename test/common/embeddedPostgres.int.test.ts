import { existsSync, statSync } from 'node:fs'
import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import { socketPath, startEmbeddedPostgres } from '../../common/src/database/embeddedPostgres.ts'
import { createPool } from '../../common/src/database/pool.ts'

// The embedded default (npm start) serves PGlite's one session to every connection of both
// services' pools. The socket server handles one protocol message at a time, so one connection's
// extended-protocol batch (Parse, Bind, Execute, Sync) must not be interleaved with another's.
describe('the embedded Postgres under concurrent connections', () => {
  it('answers each parameterised query with its own result, transactions among them', async () => {
    const embedded = await startEmbeddedPostgres()
    const pool = createPool({ connectionString: embedded.url, applicationName: 'embedded-concurrency', max: 10 })
    try {
      const answers = await Promise.allSettled(
        Array.from({ length: 400 }, async (_, n) => {
          // Every fourth caller asks inside a transaction, as POST /pets with an Idempotency-Key does.
          if (n % 4 === 0) {
            const client = await pool.connect()
            try {
              await client.query('BEGIN')
              const { rows } = await client.query<{ n: number }>('SELECT $1::int AS n', [n])
              await client.query('COMMIT')
              return rows[0]?.n
            } finally {
              client.release()
            }
          }
          const { rows } = await pool.query<{ n: number }>('SELECT $1::int AS n', [n])
          return rows[0]?.n
        }),
      )
      const failed = answers.filter((answer) => answer.status === 'rejected').length
      const wrong = answers.filter((answer, n) => answer.status === 'fulfilled' && answer.value !== n).length
      expect({ failed, wrong }).toEqual({ failed: 0, wrong: 0 })
    } finally {
      await pool.end()
      await embedded.stop()
    }
  })

  it('serves the other connections once one that left in the middle of a transaction is gone, its work rolled back', async () => {
    const embedded = await startEmbeddedPostgres()
    const other = new pg.Client({ connectionString: embedded.url })
    const leaving = new pg.Client({ connectionString: embedded.url })
    leaving.on('error', () => undefined)
    try {
      await other.connect()
      await other.query('CREATE TABLE left_behind (n int)')
      await leaving.connect()
      await leaving.query('BEGIN')
      await leaving.query('INSERT INTO left_behind VALUES ($1)', [1])
      // The network goes: no COMMIT, no ROLLBACK, no Terminate.
      ;(leaving as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy()
      const { rows } = await other.query<{ count: string }>('SELECT count(*)::text AS count FROM left_behind WHERE n = $1', [1])
      expect(rows).toEqual([{ count: '0' }])
    } finally {
      await other.end()
      await embedded.stop()
    }
  })
})

describe('the embedded Postgres on a Unix socket (npm start)', () => {
  it('answers through its URL and through libpq\'s directory and port, replaces a socket file a killed run left, and removes its own on stop', async () => {
    const directory = await mkdtemp(path.join(os.tmpdir(), 'aas-socket-'))
    const socket = path.join(directory, '.s.PGSQL.6543')
    try {
      await writeFile(socket, '')
      const embedded = await startEmbeddedPostgres({ socketDirectory: directory, port: 6543 })
      try {
        expect(statSync(socket).isSocket()).toBe(true)
        expect(statSync(socket).mode & 0o777).toBe(0o600)
        for (const config of [{ connectionString: embedded.url }, { host: directory, port: 6543, user: 'postgres', database: 'postgres' }]) {
          const client = new pg.Client(config)
          await client.connect()
          try {
            const { rows } = await client.query<{ n: number }>('SELECT $1::int AS n', [7])
            expect(rows).toEqual([{ n: 7 }])
          } finally {
            await client.end()
          }
        }
      } finally {
        await embedded.stop()
      }
      expect(existsSync(socket)).toBe(false)
    } finally {
      await rm(directory, { recursive: true, force: true })
    }
  })

  it('stops, closing it, while a client that connected as it began to stop holds its connection open', async () => {
    const directory = await mkdtemp(path.join(os.tmpdir(), 'aas-socket-'))
    try {
      const embedded = await startEmbeddedPostgres({ socketDirectory: directory, port: 6544 })
      // A client that keeps its end open after the server's (allowHalfOpen), as a stopped or stuck one would.
      const client = net.connect({ path: socketPath(directory, 6544), allowHalfOpen: true })
      const ended = once(client, 'end')
      const stopping = new Promise<void>((resolve, reject) => {
        client.once('connect', () => embedded.stop().then(resolve, reject))
      })
      try {
        const outcome = await Promise.race([stopping.then(() => 'stopped'), sleep(5_000).then(() => 'still stopping')])
        expect(outcome).toBe('stopped')
        await ended
      } finally {
        client.destroy()
        await stopping
      }
    } finally {
      await rm(directory, { recursive: true, force: true })
    }
  })
})
