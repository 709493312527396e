import { appendFileSync } from 'node:fs'

/**
 * Preloaded into a gateway child process (NODE_OPTIONS="--expose-gc --import tsx --import
 * <this file>") by the load tests: on SIGUSR2 it runs a full garbage collection and appends the
 * heap still in use, in bytes, as one line to HEAP_PROBE_FILE. The gateway's own code is unchanged.
 */
const file = process.env.HEAP_PROBE_FILE
const collect = (globalThis as { gc?: () => void }).gc
if (file && collect) {
  process.on('SIGUSR2', () => {
    // Twice: the first pass can leave objects that only become unreachable once finalizers run.
    collect()
    collect()
    const { heapUsed, rss } = process.memoryUsage()
    appendFileSync(file, `${JSON.stringify({ heapUsed, rss })}\n`)
  })
}
