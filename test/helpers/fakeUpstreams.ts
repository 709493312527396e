import http from 'node:http'
import net from 'node:net'

/**
 * Upstreams that misbehave on purpose, each a real server on an ephemeral loopback port, for
 * the proxy's failure tests. The catalogue itself is always the real pets-service.
 */
export interface TestUpstream {
  url: string
  close(): Promise<void>
}

async function listen(server: net.Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`
}

/**
 * Listens on an ephemeral loopback port. `close` destroys the connections still open first, so
 * that a client's idle keep-alive socket does not hold the server open.
 */
export async function serveOnLoopback(server: net.Server): Promise<TestUpstream> {
  const sockets = new Set<net.Socket>()
  server.on('connection', (socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
  })
  const close = () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy()
      server.close(() => resolve())
    })
  return { url: await listen(server), close }
}

type Recording = { requests: http.IncomingHttpHeaders[]; bodies: string[] }
type Scripted = { requests: { url: string; headers: http.IncomingHttpHeaders }[] }
type Answer = (request: http.IncomingMessage, response: http.ServerResponse) => void

function recording(): Recording & { handler: http.RequestListener } {
  const requests: http.IncomingHttpHeaders[] = []
  const bodies: string[] = []
  const handler: http.RequestListener = (request, response) => {
    const chunks: Buffer[] = []
    request.on('data', (chunk: Buffer) => chunks.push(chunk))
    request.on('end', () => {
      requests.push(request.headers)
      bodies.push(Buffer.concat(chunks).toString())
      response.setHeader('content-type', 'application/json')
      response.end(JSON.stringify({ path: request.url, method: request.method }))
    })
  }
  return { requests, bodies, handler }
}

function scripted(answer: Answer): Scripted & { handler: http.RequestListener } {
  const requests: { url: string; headers: http.IncomingHttpHeaders }[] = []
  const handler: http.RequestListener = (request, response) => {
    requests.push({ url: request.url ?? '', headers: request.headers })
    answer(request, response)
  }
  return { requests, handler }
}

/** Answers 200 with what it received, and remembers every request. */
export async function recordingUpstream(): Promise<TestUpstream & Recording> {
  const { handler, ...recorded } = recording()
  return { ...(await serveOnLoopback(http.createServer(handler))), ...recorded }
}

/** Answers as `answer` says: for the answers no well-behaved upstream gives (a stack trace, a trickle, its own internal headers). */
export async function scriptedUpstream(answer: Answer): Promise<TestUpstream & Scripted> {
  const { handler, ...recorded } = scripted(answer)
  return { ...(await serveOnLoopback(http.createServer(handler))), ...recorded }
}

/**
 * One address that several tests use in turn, each with its own fake behind it: from a call of
 * `recording` or `scripted` on, that one answers. Tests that need nothing of a gateway but its
 * answers (no metrics, no log) can then share one gateway in front of it instead of each starting one.
 */
export async function switchedUpstream() {
  let current: http.RequestListener = (_request, response) => void response.writeHead(500).end()
  const served = await serveOnLoopback(http.createServer((request, response) => current(request, response)))
  const use = <T extends { handler: http.RequestListener }>({ handler, ...recorded }: T) => {
    current = handler
    return { url: served.url, ...recorded }
  }
  return {
    ...served,
    recording: () => use(recording()),
    scripted: (answer: Answer) => use(scripted(answer)),
  }
}

/** Accepts connections and never answers. */
export async function silentUpstream(): Promise<TestUpstream> {
  const server = net.createServer(() => undefined)
  return serveOnLoopback(server)
}

/** Answers every request with bytes that are not HTTP. */
export async function garbageUpstream(): Promise<TestUpstream> {
  const server = net.createServer((socket) => {
    socket.once('data', () => socket.end('HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\x00\x01 broken\r\n\r\n'))
  })
  return serveOnLoopback(server)
}

/**
 * An address where nothing listens: port 2, outside the range the system hands out for port 0
 * (and, unlike 1, not a port fetch refuses to call). A port taken and freed for the purpose could
 * be given to another test's server meanwhile, which then accepted the connection and, silent,
 * turned an expected 502 into a 504.
 */
export async function refusingUpstream(): Promise<TestUpstream> {
  const refused = await new Promise<boolean>((resolve) => {
    const probe = net.connect(2, '127.0.0.1')
    probe.once('connect', () => (probe.destroy(), resolve(false)))
    probe.once('error', () => resolve(true))
  })
  if (!refused) throw new Error('something listens on 127.0.0.1:2, where refusingUpstream needs nothing to')
  return { url: 'http://127.0.0.1:2', close: async () => undefined }
}
