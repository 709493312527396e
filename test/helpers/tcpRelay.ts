import net from 'node:net'

/**
 * A TCP relay to `target` that the test can cut, silence and restore. Cutting is "the network to
 * Postgres/Redis went away": every open connection is destroyed, and until restore() every new
 * one is accepted and dropped at once (the client sees its connection reset). Silencing is "the
 * server hung mid-conversation": connections stay open but nothing more is carried either way,
 * and new ones are accepted and never answered. The relay keeps its listening port all along, so
 * no other process on the machine can take it meanwhile. Every call is idempotent.
 */
export async function cuttableRelay(target: { host: string; port: number }) {
  const pairs = new Set<{ client: net.Socket; upstream: net.Socket }>()
  let state: 'open' | 'cut' | 'silent' = 'open'
  const server = net.createServer((client) => {
    client.on('error', () => undefined)
    if (state === 'cut') {
      client.destroy()
      return
    }
    const upstream = net.connect(target)
    const pair = { client, upstream }
    pairs.add(pair)
    for (const socket of [client, upstream]) {
      socket.on('close', () => {
        pairs.delete(pair)
        client.destroy()
        upstream.destroy()
      })
      socket.on('error', () => undefined)
    }
    if (state === 'silent') silence(pair)
    else client.pipe(upstream).pipe(client)
  })
  const silence = ({ client, upstream }: { client: net.Socket; upstream: net.Socket }) => {
    client.unpipe(upstream)
    upstream.unpipe(client)
    client.pause()
    upstream.pause()
  }
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  const cut = async () => {
    state = 'cut'
    for (const { client, upstream } of pairs) {
      client.destroy()
      upstream.destroy()
    }
  }
  return {
    port,
    cut,
    /** Open connections stop carrying bytes but stay open; new ones are held unanswered. */
    async silence() {
      state = 'silent'
      for (const pair of pairs) silence(pair)
    },
    /** New connections are carried again; connections opened before a cut or silence are gone or stay mute. */
    async restore() {
      state = 'open'
    },
    /** Cuts for good and releases the port. */
    async close() {
      await cut()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
