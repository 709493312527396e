import { CLIENT_TIMEOUTS } from '../../common/src/http/clientErrors.ts'
import { mkdtempSync, rmSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import tls from 'node:tls'
import { describe, expect, it } from 'vitest'
import { readTlsPair } from '../../gateway/src/config/tlsFiles.ts'
import { issueCertificate, makeCa, opensslMissing } from '../helpers/certificates.ts'
import { recordingUpstream } from '../helpers/fakeUpstreams.ts'
import { startGateway } from '../helpers/gateway.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

const TIMEOUTS = { ...CLIENT_TIMEOUTS, headersTimeoutMillis: 500, requestTimeoutMillis: 1_000 }

/**
 * The slow-client bounds over TLS: the handshake is held to the header timeout (Node's own bound
 * is 120 s, and the HTTP parser's clocks start only after it), and the parser's refusals (408 for
 * headers that do not come) reach the client through the TLS socket.
 */
describe.skipIf(opensslMissing)('HTTPS: slow clients are cut off as on plain HTTP', () => {
  const database = suiteDatabase()
  const certificates = suiteService(async () => {
    const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-tls-timeouts-'))
    return { ca: makeCa(directory), directory, close: async () => rmSync(directory, { recursive: true, force: true }) }
  })
  const upstream = suiteService(recordingUpstream)
  const gateway = suiteService(() =>
    startGateway({
      databaseUrl: database.url,
      petsUrl: upstream.url,
      clientTimeouts: TIMEOUTS,
      tls: readTlsPair(issueCertificate(certificates.ca, 'server', 'B001')),
    }),
  )
  const gatewayPort = () => (gateway.app.server.address() as AddressInfo).port

  it('closes a connection that never starts its handshake within the header timeout, not 120 s', async () => {
    const closedAfter = await new Promise<number>((resolve, reject) => {
      const started = Date.now()
      const socket = net.connect(gatewayPort(), '127.0.0.1')
      socket.setTimeout(5_000, () => reject(new Error('still open after 5 s')))
      socket.on('error', () => undefined)
      socket.on('close', () => resolve(Date.now() - started))
    })
    expect(closedAfter).toBeGreaterThanOrEqual(TIMEOUTS.headersTimeoutMillis - 50)
    expect(closedAfter).toBeLessThan(TIMEOUTS.headersTimeoutMillis + 2_000)
  })

  it('answers 408 with the Error body, through TLS, to headers that stop coming', async () => {
    const answer = await new Promise<string>((resolve, reject) => {
      let text = ''
      const socket = tls.connect({ host: '127.0.0.1', port: gatewayPort(), ca: certificates.ca.pem, servername: 'localhost' }, () => socket.write('GET /v1/pets HTTP/1.1\r\nHost: x\r\n'))
      socket.setEncoding('utf8')
      socket.setTimeout(5_000, () => reject(new Error(`still open after 5 s: ${text}`)))
      socket.on('data', (chunk: string) => (text += chunk))
      socket.on('close', () => resolve(text))
      socket.on('error', reject)
    })
    expect(answer).toMatch(/^HTTP\/1\.1 408 /)
    expect(answer).toContain('"code":"request_timeout"')
  })

  // Left to the handshake timeout (the 10 s header timeout), such a connection held every shutdown
  // that long; on plain HTTP one that sent nothing is closed at once. A gateway of its own, with
  // the shipped timeouts: the suite's are shortened.
  it('closes a connection that never finished its handshake (a load balancer\'s pre-opened one) at once, not after the 10 s handshake timeout', async () => {
    const closing = await startGateway({ databaseUrl: database.url, petsUrl: upstream.url, tls: readTlsPair(issueCertificate(certificates.ca, 'server', 'C001')) })
    const socket = net.connect((closing.app.server.address() as AddressInfo).port, '127.0.0.1')
    socket.on('error', () => undefined)
    await new Promise((resolve) => socket.once('connect', resolve))
    try {
      const started = performance.now()
      await closing.close()
      expect(performance.now() - started).toBeLessThan(3_000)
    } finally {
      socket.destroy()
    }
  }, 30_000)
})
