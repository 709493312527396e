/**
 * The floor the pets-service is measured against: Fastify, one route, a pg.Pool of the same
 * size, the repository's first-page SQL, and nothing else (no validation, hooks, logging,
 * response schema or auth). Run by bench/targets/minimalPets.ts as its own process.
 *
 * Env: DATABASE_URL, PORT, HOST (default 127.0.0.1).
 */
import Fastify from 'fastify'
import pg from 'pg'

const INT8_OID = 20
// Same int8 → number parsing as common/src/database/pool.ts, so both rows send the same JSON.
const types = {
  getTypeParser(oid: number, format?: 'text' | 'binary') {
    if (oid === INT8_OID && format !== 'binary') return (value: string) => Number(value)
    return pg.types.getTypeParser(oid, format)
  },
}

const databaseUrl = process.env.DATABASE_URL
if (!databaseUrl) throw new Error('DATABASE_URL must be set')

const pool = new pg.Pool({ connectionString: databaseUrl, max: 10, types })
const app = Fastify({ logger: false })

app.get('/pets', async (_request, reply) => {
  const { rows } = await pool.query(
    'SELECT id, name, category_id AS "categoryId", status FROM pets.pets WHERE id > $1 ORDER BY id LIMIT $2',
    [0, 21],
  )
  return reply.send(rows.slice(0, 20))
})

await app.listen({ host: process.env.HOST || '127.0.0.1', port: Number(process.env.PORT ?? 3100) })

let stopping = false
async function shutdown(): Promise<void> {
  if (stopping) process.exit(1)
  stopping = true
  await app.close()
  await pool.end()
  process.exit(0)
}
process.on('SIGTERM', () => void shutdown())
process.on('SIGINT', () => void shutdown())
