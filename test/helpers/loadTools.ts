import http from 'node:http'
import pg from 'pg'
import { displayPrefix, generateApiKey, generateKeyId, hashApiKey } from '../../gateway/src/keys/apiKeyFormat.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { serveOnLoopback } from './fakeUpstreams.ts'

/**
 * An upstream that answers every request at once with a small JSON array: the cheapest possible
 * catalogue, so that load tests measure the gateway and not Postgres behind the pets-service.
 */
export async function staticUpstream(): Promise<{ url: string; requests(): number; close(): Promise<void> }> {
  let count = 0
  const body = '[]'
  const server = http.createServer((request, response) => {
    count++
    request.resume()
    request.on('end', () => {
      response.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': body.length })
      response.end(body)
    })
  })
  server.keepAliveTimeout = 60_000
  return { ...(await serveOnLoopback(server)), requests: () => count }
}

export interface IssuedKey {
  id: string
  key: string
  perMinute: number
}

/** One key through the repository the CLI uses (the gateway schema must already exist). */
export async function createKey(databaseUrl: string, input: { plan: string; perMinute?: number; perDay?: number }): Promise<IssuedKey> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 })
  try {
    const { record, key } = await createKeyRepository(pool).create({ name: 'load', ...input })
    return { id: record.id, key, perMinute: input.perMinute ?? 0 }
  } finally {
    await pool.end()
  }
}

/**
 * `count` valid enterprise keys with the given limits, in the key format of apiKeyFormat.ts and
 * the row shape of keyRepository.create, inserted in batches (the plaintext keys are returned).
 * Rows go in with the change-log trigger disabled for the session: the keys are new, so no
 * gateway has anything cached to invalidate, and 100,000 NOTIFYs would only slow the insert.
 */
export async function bulkInsertKeys(
  databaseUrl: string,
  count: number,
  limits: { perMinute: number; perDay: number },
): Promise<IssuedKey[]> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  const issued: IssuedKey[] = []
  try {
    await client.query('BEGIN')
    await client.query('ALTER TABLE gateway.api_keys DISABLE TRIGGER api_key_changed')
    const batch = 5_000
    for (let start = 0; start < count; start += batch) {
      const ids: string[] = []
      const hashes: Buffer[] = []
      const prefixes: string[] = []
      for (let i = start; i < Math.min(count, start + batch); i++) {
        const key = generateApiKey()
        const id = generateKeyId()
        issued.push({ id, key, perMinute: limits.perMinute })
        ids.push(id)
        hashes.push(hashApiKey(key))
        prefixes.push(displayPrefix(key))
      }
      await client.query(
        `INSERT INTO gateway.api_keys (id, key_hash, display_prefix, name, plan, per_minute, per_day)
         SELECT id, key_hash, display_prefix, 'load', 'enterprise', $4, $5
           FROM unnest($1::text[], $2::bytea[], $3::text[]) AS row(id, key_hash, display_prefix)`,
        [ids, hashes, prefixes, limits.perMinute, limits.perDay],
      )
    }
    await client.query('ALTER TABLE gateway.api_keys ENABLE TRIGGER api_key_changed')
    await client.query('COMMIT')
  } catch (error) {
    await client.query('ROLLBACK').catch(() => undefined)
    throw error
  } finally {
    await client.end()
  }
  return issued
}

/**
 * Given each admitted request's [sent, answered] interval (ms), the most admissions that are
 * certainly inside one span of `windowMillis`: requests whose whole intervals fit between one
 * request's send time and that time plus the window. A count above the limit proves
 * over-admission whatever the network delays were; the check never blames the gateway for them.
 */
export function mostAdmittedInAnyWindow(admitted: ReadonlyArray<{ sent: number; answered: number }>, windowMillis: number): number {
  const bySent = [...admitted].sort((a, b) => a.sent - b.sent)
  let most = 0
  for (let i = 0; i < bySent.length; i++) {
    const start = bySent[i]!.sent
    let inside = 0
    for (let j = i; j < bySent.length && bySent[j]!.sent < start + windowMillis; j++) {
      if (bySent[j]!.answered < start + windowMillis) inside++
    }
    most = Math.max(most, inside)
  }
  return most
}
