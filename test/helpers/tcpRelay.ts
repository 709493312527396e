import net from 'node:net'

/**
 * A TCP relay to `target` that the test can cut and restore: "the network to Postgres/Redis went
 * away". Cutting destroys every open connection, and until restore() every new one is accepted and
 * dropped at once (the client sees its connection reset). The relay keeps its listening port all
 * along, so no other process on the machine can take it while the path is cut. Both calls are
 * idempotent.
 */
export async function cuttableRelay(target: { host: string; port: number }) {
  const sockets = new Set<net.Socket>()
  let open = true
  const server = net.createServer((client) => {
    client.on('error', () => undefined)
    if (!open) {
      client.destroy()
      return
    }
    const upstream = net.connect(target)
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on('close', () => sockets.delete(socket))
      socket.on('error', () => undefined)
    }
    client.pipe(upstream).pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  const cut = async () => {
    open = false
    for (const socket of sockets) socket.destroy()
  }
  return {
    port,
    cut,
    async restore() {
      open = true
    },
    /** Cuts for good and releases the port. */
    async close() {
      await cut()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
