import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { connectRedis } from '../../gateway/src/rateLimit/redisStore.ts'
import { issueCertificate, makeCa, opensslMissing, type TestCertificate } from '../helpers/certificates.ts'
import { eventually } from './rateLimit/httpLimits.ts'

// The gateway connects to REDIS_URL when REDIS_CLUSTER_NODES names no seed (blank, or commas only):
// the certificate must come with that connection too.
describe.skipIf(opensslMissing)('the certificate connectRedis presents to a rediss:// REDIS_URL', () => {
  let directory: string
  let server: tls.Server
  let client: TestCertificate
  const presented: string[] = []

  beforeAll(async () => {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-redis-client-cert-'))
    const ca = makeCa(directory)
    const own = issueCertificate(ca, 'server', '7001')
    client = issueCertificate(ca, 'client', '7002')
    // TLS 1.2: the client sends its certificate before it judges the server's (whose CA it does not
    // trust here), so the server sees what it would present.
    server = tls.createServer({ cert: readFileSync(own.certFile), key: readFileSync(own.keyFile), ca: ca.pem, requestCert: true, rejectUnauthorized: false, maxVersion: 'TLSv1.2' }, (socket) => {
      presented.push(socket.getPeerCertificate().serialNumber ?? 'none')
      socket.destroy()
    })
    server.on('tlsClientError', (error) => presented.push(`error: ${error.message}`))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  })
  afterAll(async () => {
    await new Promise((resolve) => server?.close(resolve))
    if (directory) rmSync(directory, { recursive: true, force: true })
  })

  it('presents it when REDIS_CLUSTER_NODES resolved to no seed', async () => {
    const { port } = server.address() as { port: number }
    const redis = connectRedis({ url: `rediss://127.0.0.1:${port}`, clusterNodes: [], clientCertificate: client, commandTimeoutMillis: 100 })
    redis.on('error', () => undefined)
    try {
      await eventually(async () => presented.length > 0, 5_000)
      expect(presented).toContain(client.serialNumber)
    } finally {
      redis.disconnect()
    }
  })
})
