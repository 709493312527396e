import { mkdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { freePort, startChildServer } from '../lib/childServer.ts'
import { childPids, findNginx, nginxConfig } from '../lib/nginx.ts'
import { checkFirstPetsPage } from './petsPage.ts'
import { PROXY_PATH } from './proxyRows.ts'
import { firstFailure, staticUpstream } from './shared.ts'
import type { BenchTarget } from './types.ts'

/** Idle keep-alive connections nginx keeps to the upstream: the most connections any level opens. */
const UPSTREAM_KEEPALIVE = 128

/**
 * nginx as a plain reverse proxy in front of the same static upstream: what a proxy in C costs on
 * this machine, the ceiling every Node row is read against. Skipped when nginx is not installed.
 */
export const nginxTarget: BenchTarget = {
  id: 'nginx',
  label: 'nginx reverse proxy (C ceiling)',
  request: `GET ${PROXY_PATH}`,
  description:
    'nginx (BENCH_NGINX, else PATH, else /usr/sbin/nginx) in the foreground with a config generated for the run ' +
    '(bench/lib/nginx.ts) in a temporary folder, never the system service: worker_processes 1, no access log, ' +
    `HTTP/1.1 keep-alive to the static upstream (keepalive ${UPSTREAM_KEEPALIVE}), /v1/ → the upstream’s /; ` +
    'server CPU counts the master and its worker.',
  checkResponse: checkFirstPetsPage,
  openLoop: true,
  unavailable: () => (findNginx() === undefined ? 'nginx is not installed (looked at BENCH_NGINX, PATH, /usr/sbin/nginx)' : undefined),
  async start(context) {
    const binary = findNginx()
    if (binary === undefined) throw new Error('nginx is not installed')
    const upstream = await staticUpstream(context)
    const port = await freePort()
    const directory = path.join(context.logDir, 'nginx')
    await mkdir(directory, { recursive: true })
    const configFile = path.join(directory, 'nginx.conf')
    await writeFile(
      configFile,
      nginxConfig({
        directory,
        listenPort: port,
        upstream: new URL(upstream.origin).host,
        prefix: '/v1/',
        upstreamKeepalive: UPSTREAM_KEEPALIVE,
      }),
    )
    const url = `http://127.0.0.1:${port}${PROXY_PATH}`
    const server = await startChildServer({
      name: 'nginx',
      script: binary,
      command: { file: binary, args: ['-p', directory, '-c', configFile, '-e', path.join(directory, 'error.log')] },
      env: {},
      readyUrl: url,
      logFile: path.join(context.logDir, 'nginx.log'),
    })
    return {
      url,
      headers: {},
      // The master and its one worker (the worker does the proxying).
      pids: [server.pid, ...childPids(server.pid)],
      supporting: [{ role: 'upstream', pid: upstream.pid }],
      failure: firstFailure({ name: 'nginx', failure: server.exitReason }, { name: 'static upstream', failure: upstream.failure }),
      stop: () => server.stop(),
    }
  },
}
