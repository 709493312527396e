import http from 'node:http'
import { describe, expect, it } from 'vitest'
import { AUTH_CHECK_PATH, upstreamAcceptsGateway } from '../../gateway/src/upstreamCheck.ts'
import { refusingUpstream } from '../helpers/fakeUpstreams.ts'

const TOKEN = 'upstream-check-internal-token-0123'

/** An upstream that accepts TOKEN at /auth-check, on `port` (0: any), or undefined when that port is taken. */
async function acceptingUpstream(port: number): Promise<{ url: string; close: () => Promise<void> } | undefined> {
  const server = http.createServer((request, response) => {
    const accepted = request.url === AUTH_CHECK_PATH && request.headers['x-internal-token'] === TOKEN
    response.writeHead(accepted ? 204 : 401).end()
  })
  const listening = await new Promise<boolean>((resolve) => {
    server.once('error', () => resolve(false))
    server.listen(port, '127.0.0.1', () => resolve(true))
  })
  if (!listening) return undefined
  const { port: bound } = server.address() as { port: number }
  return { url: `http://127.0.0.1:${bound}`, close: () => new Promise((resolve) => server.close(() => resolve())) }
}

describe('the readiness check of the upstream', () => {
  // Ports fetch refuses to call (the browsers' blocked list): an upstream on one was never ready.
  it.each([10080, 6666])('passes for an upstream on port %i that accepts the internal credential', async (port) => {
    const upstream = await acceptingUpstream(port)
    if (!upstream) return void console.warn(`port ${port} is taken here: not checked`)
    try {
      await expect(upstreamAcceptsGateway(upstream.url, TOKEN)()).resolves.toBeUndefined()
      await expect(upstreamAcceptsGateway(upstream.url, 'another-token-0123456789')()).rejects.toThrow('refuses the internal credential (401)')
    } finally {
      await upstream.close()
    }
  })

  it('fails naming the address and the reason when nothing listens there', async () => {
    const dead = await refusingUpstream()
    await expect(upstreamAcceptsGateway(dead.url, TOKEN)()).rejects.toThrow(`no answer from ${dead.url} (ECONNREFUSED)`)
  })
})
