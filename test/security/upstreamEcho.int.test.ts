import net from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import { createPool } from '../../common/src/database/pool.ts'
import { createKeyRepository } from '../../gateway/src/keys/keyRepository.ts'
import { serveOnLoopback } from '../helpers/fakeUpstreams.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'
import { OPS_TEST_TOKEN, startGatewayProcess } from '../ops/gatewayProcess.ts'
import { killAll } from '../scripts/processes.ts'

/** An upstream that answers with no HTTP at all, echoing the request it got (as a broken proxy or a debug endpoint might). */
async function echoingGarbageUpstream() {
  const server = net.createServer((socket) => {
    socket.once('data', (request: Buffer) => socket.end(`GARBAGE ${request.toString('latin1')}`))
  })
  return serveOnLoopback(server)
}

describe('an upstream that echoes the request it got as garbage', () => {
  const database = suiteDatabase()
  afterEach(killAll)

  // undici's parser error keeps the bytes it could not parse (err.data), and the gateway's warn line
  // logged them whole: the internal token the gateway adds, and the key the client put in its URL.
  it('gets 502, and the gateway log holds neither the internal token nor the key the client sent in the path and query', async () => {
    const upstream = await echoingGarbageUpstream()
    const gateway = await startGatewayProcess({ databaseUrl: database.url, petsUrl: upstream.url, notReady: true, env: { LOG_LEVEL: 'trace' } })
    const pool = createPool({ connectionString: database.url, applicationName: 'security-test' })
    try {
      const { key } = await createKeyRepository(pool).create({ name: 'echo', plan: 'pro' })
      for (const path of [`/v1/pets?x=${key}`, `/v1/pets/${key}`]) {
        const response = await fetch(`${gateway.url}${path}`, { headers: { authorization: `Bearer ${key}` } })
        expect(response.status, path).toBe(502)
        expect(((await response.json()) as { code: string }).code).toBe('bad_gateway')
      }
      gateway.proc.child.kill('SIGTERM')
      await new Promise((resolve) => gateway.proc.child.once('exit', resolve))
      const log = gateway.proc.output()
      expect(log).toContain('upstream request failed')
      expect(log).toContain('from the peer]')
      expect(log).not.toContain('GARBAGE')
      expect(log).not.toContain(OPS_TEST_TOKEN)
      expect(log).not.toContain(key)
      expect(log).not.toContain(key.slice(4))
    } finally {
      await pool.end()
      await upstream.close()
      gateway.cleanup()
    }
  })
})
