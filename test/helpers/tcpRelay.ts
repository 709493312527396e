import net from 'node:net'

/**
 * A TCP relay to `target` that the test can cut, silence, slow down and restore. Cutting is "the
 * network to Postgres/Redis went away": every open connection is destroyed, and until restore()
 * every new one is accepted and dropped at once (the client sees its connection reset). Silencing
 * is "the server hung mid-conversation": connections stay open but nothing more is carried either
 * way, and new ones are accepted and never answered. Delaying is "a congested network": what a
 * client of a connection opened then sends reaches the target that much later. Forging is "an
 * on-path attacker on a cleartext connection": whatever the target answers reaches the client as
 * the bytes the test gives instead. The relay keeps its
 * listening port all along, so no other process on the machine can take it meanwhile. Every call
 * is idempotent.
 */
export async function cuttableRelay(target: { host: string; port: number }) {
  let to = target
  const pairs = new Set<{ client: net.Socket; upstream: net.Socket }>()
  let state: 'open' | 'cut' | 'silent' = 'open'
  let delayMillis = 0
  let forged: Buffer | undefined
  const forging = new WeakSet<net.Socket>()
  const server = net.createServer((client) => {
    client.on('error', () => undefined)
    if (state === 'cut') {
      client.destroy()
      return
    }
    const upstream = net.connect(to)
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
    else if (forged !== undefined) {
      client.pipe(upstream)
      forge(pair, forged)
    } else if (delayMillis > 0) {
      const delay = delayMillis
      client.on('data', (chunk) => setTimeout(() => upstream.write(chunk), delay))
      upstream.pipe(client)
    } else client.pipe(upstream).pipe(client)
  })
  const silence = ({ client, upstream }: { client: net.Socket; upstream: net.Socket }) => {
    client.unpipe(upstream)
    upstream.unpipe(client)
    client.pause()
    upstream.pause()
  }
  const forge = ({ client, upstream }: { client: net.Socket; upstream: net.Socket }, reply: Buffer) => {
    if (forging.has(upstream)) return
    forging.add(upstream)
    upstream.unpipe(client)
    // Unpiped, the stream is paused, and a new 'data' listener does not resume it.
    upstream.on('data', () => client.write(reply)).resume()
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
    /** What clients of connections opened from now on send reaches the target `millis` later. */
    async delay(millis: number) {
      delayMillis = millis
    },
    /** Every chunk the target sends, on open connections and new ones, reaches the client as `reply`. */
    async forge(reply: Buffer) {
      forged = reply
      for (const pair of pairs) forge(pair, reply)
    },
    /** New connections are carried again, undelayed and unforged; connections opened before a cut, silence or forgery are gone, stay mute or stay forged. */
    async restore() {
      state = 'open'
      delayMillis = 0
      forged = undefined
    },
    /** Connections opened from now on go to `next`; open ones stay where they are (a DNS name moved to another server). */
    async redirect(next: { host: string; port: number }) {
      to = next
    },
    /** Cuts for good and releases the port. */
    async close() {
      await cut()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

/** A cuttableRelay to the server `url` names (at `defaultPort` when it names none), and `url` through it. */
export async function relayTo(url: string, defaultPort = 5432) {
  const target = new URL(url)
  const relay = await cuttableRelay({ host: target.hostname, port: Number(target.port || defaultPort) })
  const through = new URL(url)
  through.host = `127.0.0.1:${relay.port}`
  return { relay, url: through.toString() }
}

/** A Postgres client's goodbye (Terminate), which pg sends as a write of its own. */
const TERMINATE = Buffer.from([0x58, 0, 0, 0, 4])

/**
 * A relay to the Postgres `url` names, and `url` through it, that carries everything until a
 * client says goodbye (Terminate), then nothing either way on that connection and closes nothing:
 * a Postgres that stopped answering just as the client ended its session, whose goodbye (the
 * connection's close) never comes. `goodbyes` counts the Terminates it kept.
 */
export async function goodbyeUnansweredRelay(url: string) {
  const target = new URL(url)
  const sockets = new Set<net.Socket>()
  const state = { goodbyes: 0 }
  const server = net.createServer({ allowHalfOpen: true }, (client) => {
    const upstream = net.connect({ host: target.hostname, port: Number(target.port || 5432), allowHalfOpen: true })
    let mute = false
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on('error', () => undefined)
    }
    client.on('data', (chunk: Buffer) => {
      if (mute) return
      if (chunk.subarray(-TERMINATE.length).equals(TERMINATE)) {
        mute = true
        state.goodbyes++
        upstream.write(chunk.subarray(0, -TERMINATE.length))
      } else upstream.write(chunk)
    })
    upstream.on('data', (chunk: Buffer) => void (mute || client.write(chunk)))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const through = new URL(url)
  through.host = `127.0.0.1:${(server.address() as net.AddressInfo).port}`
  return {
    url: through.toString(),
    state,
    async close() {
      for (const socket of sockets) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
