import { Writable } from 'node:stream'

/** A log destination for a service started in the test process: every line it writes, kept. */
export function captureLog() {
  const lines: string[] = []
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(...chunk.toString().split('\n').filter(Boolean))
      done()
    },
  })
  return {
    lines,
    stream,
    /** The lines as JSON objects (pino writes one per line). */
    entries: () => lines.map((line) => JSON.parse(line) as Record<string, unknown>),
  }
}
