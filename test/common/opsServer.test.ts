import type { AddressInfo } from 'node:net'
import net from 'node:net'
import { pino } from 'pino'
import { Registry } from 'prom-client'
import { describe, expect, it } from 'vitest'
import { buildOpsServer } from '../../common/src/ops/opsServer.ts'

describe('the ops port', () => {
  it('answers a flood of /readyz with one check of the dependencies at a time, and checks again for the next probe', async () => {
    let checks = 0
    const ops = buildOpsServer({
      registry: new Registry(),
      logger: pino({ level: 'silent' }),
      isAccepting: () => true,
      dependencies: {
        postgres: async () => {
          checks++
          await new Promise((resolve) => setTimeout(resolve, 100))
        },
      },
    })
    try {
      const answers = await Promise.all(Array.from({ length: 50 }, () => ops.inject('/readyz')))
      expect(answers.map((answer) => answer.statusCode)).toEqual(Array(50).fill(200))
      expect(checks).toBe(1)
      expect((await ops.inject('/readyz')).json()).toEqual({ status: 'ready', dependencies: { postgres: 'up' } })
      expect(checks).toBe(2)
    } finally {
      await ops.close()
    }
  })

  it("gives a client 10 s to send its request, as the public port does, not Node's 60 s for headers and 5 min in all", async () => {
    const ops = buildOpsServer({ registry: new Registry(), logger: pino({ level: 'silent' }), isAccepting: () => true, dependencies: {} })
    await ops.listen({ host: '127.0.0.1', port: 0 })
    try {
      expect(ops.server.headersTimeout).toBe(10_000)
      expect(ops.server.requestTimeout).toBe(10_000)
    } finally {
      await ops.close()
    }
  })

  it('closes at once with a connection open that never sent a request (a load balancer\'s TCP check), not after its 10 s', async () => {
    const ops = buildOpsServer({ registry: new Registry(), logger: pino({ level: 'silent' }), isAccepting: () => true, dependencies: {} })
    await ops.listen({ host: '127.0.0.1', port: 0 })
    const quiet = net.connect((ops.server.address() as AddressInfo).port, '127.0.0.1')
    quiet.on('error', () => undefined)
    await new Promise((resolve) => quiet.once('connect', resolve))
    // A scrape half sent: its request line, and no more.
    const halfSent = net.connect((ops.server.address() as AddressInfo).port, '127.0.0.1')
    halfSent.on('error', () => undefined)
    halfSent.write('GET /metrics HTTP/1.1\r\n')
    await new Promise((resolve) => setTimeout(resolve, 100))
    const started = performance.now()
    await ops.close()
    expect(performance.now() - started).toBeLessThan(2_000)
    // Both closed by the server (a connection left open would hold this test to its timeout).
    await Promise.all([quiet, halfSent].map((socket) => (socket.closed ? undefined : new Promise((resolve) => socket.once('close', resolve)))))
  })
})
