import { readFileSync, writeFileSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'

// Ports for the processes the tests start. Not the OS's pick (listen on 0, release, pass the number
// on): that port lies in the ephemeral range, where any outgoing connection of a load test can take
// it before the child binds it (CI saw a gateway fail with EADDRINUSE that way). These come from
// 12000–21999, below Linux's ephemeral range (32768+), and a Redis Cluster node's bus port
// (port + 10000) stays below it too. Each vitest worker draws from its own slice, so two test
// files running side by side never pick the same port.
const FIRST = 12_000
const SLICES = 16
const SLICE_SIZE = 625

const worker = (Number(process.env.VITEST_POOL_ID ?? process.pid) || 0) % SLICES
const sliceStart = FIRST + worker * SLICE_SIZE
// The test files a worker runs one after another are separate processes. Each continues where the
// last one stopped (a cursor file per slice), so a port comes round again only after the whole
// slice: a process a previous file left behind, still starting when that file ended, cannot bind
// a port this file has just been given.
const cursorFile = path.join(os.tmpdir(), `aas-test-ports-${sliceStart}`)

function nextOffset(): number {
  let offset: number
  try {
    offset = Number.parseInt(readFileSync(cursorFile, 'utf8'), 10)
  } catch {
    offset = Number.NaN
  }
  if (!Number.isInteger(offset) || offset < 0) offset = Math.floor(Math.random() * SLICE_SIZE)
  writeFileSync(cursorFile, String((offset + 1) % SLICE_SIZE))
  return offset % SLICE_SIZE
}

export function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer()
    server.once('error', () => resolve(false))
    server.listen({ host: '127.0.0.1', port, exclusive: true }, () => server.close(() => resolve(true)))
  })
}

/** A loopback port nothing listens on, outside the ephemeral range and this worker's own. */
export async function freePort(): Promise<number> {
  for (let tries = 0; tries < SLICE_SIZE; tries++) {
    const port = sliceStart + nextOffset()
    if (await canListen(port)) return port
  }
  throw new Error(`no free port in ${sliceStart}–${sliceStart + SLICE_SIZE - 1}`)
}
