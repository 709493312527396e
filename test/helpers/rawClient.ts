import net from 'node:net'

/** A raw TCP connection to an HTTP server: the test decides every byte and when it is sent. */
export interface RawConnection {
  socket: net.Socket
  /** Everything the server has sent so far. */
  answer(): string
  isClosed(): boolean
  /** Resolves, once the server or the client has closed the connection, with the ms since it opened. */
  closed: Promise<number>
  /** Writes `bytes` one character at a time, `intervalMillis` apart, until done or the connection closes. */
  dribble(bytes: string, intervalMillis: number): Promise<void>
}

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

export function openRaw(url: string): Promise<RawConnection> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const openedAt = performance.now()
    const socket = net.connect(Number(port), hostname)
    let text = ''
    let closed = false
    socket.setEncoding('utf8')
    socket.on('data', (chunk: string) => (text += chunk))
    const whenClosed = new Promise<number>((resolveClosed) =>
      socket.once('close', () => {
        closed = true
        resolveClosed(performance.now() - openedAt)
      }),
    )
    socket.once('connect', () => {
      socket.removeListener('error', reject)
      // A reset from the server after it answered is an ordinary close for these tests.
      socket.on('error', () => undefined)
      resolve({
        socket,
        answer: () => text,
        isClosed: () => closed,
        closed: whenClosed,
        async dribble(bytes, intervalMillis) {
          for (const character of bytes) {
            if (closed || socket.destroyed || !socket.writable) return
            socket.write(character)
            await sleep(intervalMillis)
          }
        },
      })
    })
    socket.once('error', reject)
  })
}

/** Status line, head and parsed JSON body of a raw HTTP answer. */
export function parseAnswer(answer: string): { statusLine: string; head: string; body: unknown } {
  const split = answer.indexOf('\r\n\r\n')
  const head = split === -1 ? answer : answer.slice(0, split)
  const body = split === -1 ? '' : answer.slice(split + 4)
  return { statusLine: head.split('\r\n')[0] ?? '', head, body: body ? (JSON.parse(body) as unknown) : undefined }
}
