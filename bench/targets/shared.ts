import path from 'node:path'
import { freePort, startChildServer } from '../lib/childServer.ts'
import { startPrivateRedis, type PrivateRedis } from '../lib/redisServer.ts'
import type { SharedService, TargetContext } from './types.ts'

export interface StaticUpstream extends SharedService {
  /** http://127.0.0.1:port, no path. */
  origin: string
}

/**
 * bench/servers/staticUpstream.ts, started once per run: the upstream of every proxy row. With
 * `busyMicros`, a separate instance that busy-waits that long on every request (experiment rows).
 */
export function staticUpstream(context: TargetContext, options: { busyMicros?: number } = {}): Promise<StaticUpstream> {
  const busyMicros = options.busyMicros ?? 0
  const name = busyMicros > 0 ? `static-upstream-busy-${busyMicros}` : 'static-upstream'
  return context.shared(name, async () => {
    const port = await freePort()
    const origin = `http://127.0.0.1:${port}`
    const server = await startChildServer({
      name,
      script: 'bench/servers/staticUpstream.ts',
      nodeArgs: context.nodeArgs,
      env: { PORT: String(port), HOST: '127.0.0.1', BUSY_MICROS: String(busyMicros) },
      readyUrl: `${origin}/pets`,
      logFile: path.join(context.logDir, `${name}.log`),
    })
    return { origin, pid: server.pid, failure: server.exitReason, stop: () => server.stop() }
  })
}

/** One private redis-server per run, shared by the peer and the gateway (their rounds never overlap). */
export function privateRedis(context: TargetContext): Promise<PrivateRedis> {
  return context.shared('redis', () => startPrivateRedis(context.logDir))
}

/** The first failure among a target's own process and the shared ones it depends on. */
export function firstFailure(...sources: Array<{ name: string; failure(): string | undefined }>): () => string | undefined {
  return () => {
    for (const source of sources) {
      const failure = source.failure()
      if (failure !== undefined) return `(${source.name}) ${failure}`
    }
    return undefined
  }
}
