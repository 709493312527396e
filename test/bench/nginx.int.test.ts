import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { afterEach, describe, expect, it } from 'vitest'
import { startChildServer, type ChildServer } from '../../bench/lib/childServer.ts'
import { freePort } from '../helpers/ports.ts'
import { childPids, findNginx, nginxConfig } from '../../bench/lib/nginx.ts'

const nginx = findNginx()

describe.skipIf(nginx === undefined)('nginx with the bench-generated config (skipped when nginx is not installed)', () => {
  const cleanup: Array<() => Promise<unknown>> = []
  afterEach(async () => {
    for (const step of cleanup.splice(0).reverse()) await step()
  })

  it('proxies /v1/pets to the upstream’s /pets over a few reused upstream connections, without touching the system nginx', async () => {
    const seen: string[] = []
    let upstreamConnections = 0
    const upstream = http.createServer((request, response) => {
      seen.push(request.url ?? '')
      response.writeHead(200, { 'content-type': 'application/json' }).end('[{"id":1}]')
    })
    upstream.on('connection', () => (upstreamConnections += 1))
    upstream.listen(0, '127.0.0.1')
    await once(upstream, 'listening')
    cleanup.push(() => new Promise((resolve) => upstream.close(resolve)).then(() => upstream.closeAllConnections()))

    const directory = await mkdtemp(path.join(os.tmpdir(), 'aas-bench-nginx-'))
    cleanup.push(() => rm(directory, { recursive: true, force: true }))
    const port = await freePort()
    const configFile = path.join(directory, 'nginx.conf')
    await writeFile(
      configFile,
      nginxConfig({ directory, listenPort: port, upstream: `127.0.0.1:${(upstream.address() as AddressInfo).port}`, prefix: '/v1/', upstreamKeepalive: 16 }),
    )
    const server: ChildServer = await startChildServer({
      name: 'nginx',
      script: nginx as string,
      command: { file: nginx as string, args: ['-p', directory, '-c', configFile, '-e', path.join(directory, 'error.log')] },
      env: {},
      readyUrl: `http://127.0.0.1:${port}/v1/ready`,
      logFile: path.join(directory, 'stdout.log'),
    })
    cleanup.push(() => server.stop())
    expect(childPids(server.pid)).toHaveLength(1) // one worker under the master

    const responses = await Promise.all(
      Array.from({ length: 40 }, () => fetch(`http://127.0.0.1:${port}/v1/pets?limit=20`).then(async (response) => [response.status, await response.text()])),
    )
    expect(responses.every(([status, body]) => status === 200 && body === '[{"id":1}]')).toBe(true)
    expect(seen.filter((url) => url === '/pets?limit=20')).toHaveLength(40)
    // Keep-alive to the upstream: sequential requests reuse the connections the burst opened.
    const before = upstreamConnections
    for (let index = 0; index < 10; index += 1) await (await fetch(`http://127.0.0.1:${port}/v1/pets`)).text()
    expect(upstreamConnections).toBe(before)

    await server.stop()
    expect(server.exitReason()).toBeDefined()
  })
})
