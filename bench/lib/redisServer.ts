import { spawn, type ChildProcess } from 'node:child_process'
import path from 'node:path'
import { Redis } from 'ioredis'
import { freePort } from './childServer.ts'

/**
 * A private `redis-server` for the run (never the shared one on 6379): nothing else sends it
 * commands, so `INFO commandstats` deltas around a round are that round's commands.
 */
export interface PrivateRedis extends RedisProbe {
  url: string
  pid: number
  failure(): string | undefined
  stop(): Promise<void>
}

/** Commands seen by MONITOR while some work ran: sent by clients, and run by Lua scripts (redis.call). */
export interface MonitorSample {
  client: Record<string, number>
  script: Record<string, number>
}

/** What the harness reads from the private Redis around rounds. */
export interface RedisProbe {
  /**
   * Calls per command name so far (lower case: `evalsha`, `get`, …), from INFO commandstats.
   * Redis counts the commands a Lua script runs with redis.call there too, under their own names.
   */
  commandCalls(): Promise<Map<string, number>>
  /** Runs `work` with a MONITOR connection open and counts what it saw, by source. */
  monitor(work: () => Promise<void>): Promise<MonitorSample>
}

export class RedisUnavailableError extends Error {
  override name = 'RedisUnavailableError'
}

/** Parses `INFO commandstats`: `cmdstat_evalsha:calls=12,usec=…` lines. */
export function parseCommandStats(info: string): Map<string, number> {
  const calls = new Map<string, number>()
  for (const line of info.split('\n')) {
    const match = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim())
    if (match?.[1] && match[2]) calls.set(match[1].toLowerCase(), Number(match[2]))
  }
  return calls
}

const delay = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

export async function startPrivateRedis(logDir: string, binary = process.env.BENCH_REDIS_SERVER || 'redis-server'): Promise<PrivateRedis> {
  const port = await freePort()
  let failure: string | undefined
  const child: ChildProcess = spawn(
    binary,
    [
      '--port', String(port),
      '--bind', '127.0.0.1',
      '--save', '',
      '--appendonly', 'no',
      '--loglevel', 'warning',
      '--logfile', path.join(logDir, 'redis.log'),
    ],
    { stdio: 'ignore' },
  )
  child.once('error', (error) => (failure = `could not be spawned: ${error.message}`))
  child.once('exit', (code, signal) => (failure = `exited (${signal ? `signal ${signal}` : `code ${code}`})`))

  const url = `redis://127.0.0.1:${port}`
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null })
  client.on('error', () => undefined)
  const exited = () => child.exitCode !== null || child.signalCode !== null
  const stop = async () => {
    client.disconnect()
    if (exited() || child.pid === undefined) return
    child.kill('SIGTERM')
    for (let waited = 0; waited < 5_000 && !exited(); waited += 50) await delay(50)
    if (!exited()) child.kill('SIGKILL')
  }

  const deadline = Date.now() + 10_000
  for (;;) {
    if (failure !== undefined) {
      throw new RedisUnavailableError(
        `${binary} ${failure}; install Redis (apt-get install redis-server) or set BENCH_REDIS_SERVER to its binary`,
      )
    }
    try {
      if (client.status === 'wait' || client.status === 'end') await client.connect()
      if ((await client.ping()) === 'PONG') break
    } catch {
      // Not listening yet.
    }
    if (Date.now() > deadline) {
      await stop()
      throw new RedisUnavailableError(`${binary} did not answer on port ${port} within 10 s`)
    }
    await delay(50)
  }

  return {
    url,
    pid: child.pid ?? -1,
    failure: () => failure,
    async commandCalls() {
      return parseCommandStats(await client.info('commandstats'))
    },
    async monitor(work) {
      const sample: MonitorSample = { client: {}, script: {} }
      const monitor = await client.duplicate({ lazyConnect: false }).monitor()
      monitor.on('monitor', (_time: string, args: string[], source: string) => {
        const name = String(args[0] ?? '').toLowerCase()
        const bucket = source === 'lua' ? sample.script : sample.client
        bucket[name] = (bucket[name] ?? 0) + 1
      })
      try {
        await work()
        await delay(200) // MONITOR lines trail the replies a little
      } finally {
        monitor.disconnect()
      }
      return sample
    },
    stop,
  }
}
