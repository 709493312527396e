import { Cluster } from 'ioredis'
import type { Redis } from 'ioredis'
import { oneRunAtATime } from '../../../common/src/lifecycle/oneRunAtATime.ts'
import type { RedisClient } from './redisStore.ts'

// What the Redis servers say of themselves in INFO (which the README's ACL grants): whether they
// evict keys when full, and whether they are still the servers they were.

/**
 * The Redis servers (a Cluster's masters) that evict keys when full, each named with its policy:
 * a `maxmemory` with any `maxmemory-policy` but `noeviction` (ElastiCache's default is
 * `volatile-lru`). Every key the gateway writes has a TTL, so such a server drops counts, strikes
 * and bans when it fills, without a word: keys over their limits are admitted again and bans end
 * early. `noeviction` refuses the write instead (OOM), which the gateway answers per
 * onStoreFailure and counts. Read from INFO (the README's ACL grants `+info`; CONFIG GET is often
 * barred on managed Redis); a server that does not answer is left out.
 */
export async function evictingRedisServers(client: RedisClient): Promise<string[]> {
  const policies = await Promise.all(serversOf(client).map(async ([name, server]) => {
    try {
      const memory = parseInfo(await server.info('memory'))
      const policy = memory.get('maxmemory_policy')
      if (policy === undefined || policy === 'noeviction' || Number(memory.get('maxmemory') ?? 0) === 0) return undefined
      return client instanceof Cluster ? `${name}: ${policy}` : policy
    } catch {
      return undefined
    }
  }))
  return policies.filter((policy) => policy !== undefined)
}

/**
 * Calls `restarted` when the Redis server (a Cluster's masters) the client is ready with again is
 * not the one it was ready with before: another process (`run_id` in INFO), a restart or a
 * failover. Its state may be gone with it (no persistence, writes a failover lost), and what this
 * process cached from the old one (bans) would then disagree with every other gateway until it
 * ran out. A server is its process and its replication history (`master_replid`, new at each
 * promotion): a replica promoted where it had been master before (failovers back and forth) is
 * the same process at the same address, and was missed. (A master left without replicas for
 * repl-backlog-ttl takes a new one too: its bans are then asked again once, which costs a call.)
 *
 * A Cluster client is ready once, as a whole: one master restarted alone comes back as a new
 * connection to its node, and a replica promoted in a failover shows in the next slot map. So
 * for a Cluster the masters are read again on each node connection's ready and each refresh of
 * the slot map (every 5 s), one reading at a time (oneRunAtATime: an older one never overtakes a
 * newer one).
 */
export function watchRedisRestarts(client: RedisClient, restarted: () => void): void {
  // Each server's (master's) identity by its name, as last read. One that does not answer, or is
  // missing from a slot map for a moment, keeps its entry: only a server seen again as another
  // process, or a master at an address not seen before (a replica promoted), is a change.
  const known = new Map<string, string>()
  const check = oneRunAtATime(async () => {
    let changed = false
    for (const [name, identity] of await serverIdentities(client)) {
      const before = known.get(name)
      if (before === undefined ? known.size > 0 : before !== identity) changed = true
      known.set(name, identity)
    }
    if (changed) restarted()
  })
  const read = () => void check()
  client.on('ready', read)
  if (client instanceof Cluster) {
    client.on('+node', (node: Redis) => node.on('ready', read))
    client.on('refresh', read)
  }
}

/** Who the server, or each master, is by name (run_id and master_replid); those that do not answer are left out. */
async function serverIdentities(client: RedisClient): Promise<Map<string, string>> {
  const read = await Promise.all(
    serversOf(client).map(async ([name, server]) => {
      try {
        const [about, replication] = await Promise.all([server.info('server'), server.info('replication')])
        const id = parseInfo(about).get('run_id')
        return id === undefined ? [] : [[name, `${id} ${parseInfo(replication).get('master_replid') ?? ''}`] as const]
      } catch {
        return []
      }
    }),
  )
  return new Map(read.flat())
}

/** The server, or a Cluster's masters, each with its name (host:port in a Cluster). */
function serversOf(client: RedisClient): [string, Redis][] {
  return client instanceof Cluster ? client.nodes('master').map((node) => [`${node.options.host}:${node.options.port}`, node]) : [['redis', client]]
}

function parseInfo(text: string): Map<string, string> {
  return new Map(text.split('\r\n').flatMap((line) => {
    const colon = line.indexOf(':')
    return colon > 0 ? [[line.slice(0, colon), line.slice(colon + 1)] as const] : []
  }))
}
