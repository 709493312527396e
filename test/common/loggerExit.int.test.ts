import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { describe, expect, it } from 'vitest'
import { ROOT } from '../scripts/processes.ts'

describe('a service whose stdout reader has gone', () => {
  // Regression: the exit's synchronous flush of the last batched lines retried EPIPE forever
  // (sonic-boom 4 sleeps and retries every error but EAGAIN), so SIGTERM's drain finished and the
  // process never exited; `npm start | head` or a log shipper that died left it hanging.
  it('exits at once, dropping the lines that have nowhere to go', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/processes/logThenExit.ts'], {
      cwd: ROOT,
      stdio: ['pipe', 'pipe', 'pipe'],
    })
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
    try {
      let stderr = ''
      child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
      await expect.poll(() => stderr, { timeout: 20_000 }).toContain('ready')
      child.stdout.destroy()
      child.stdin.write('exit\n')
      const outcome = await Promise.race([exited, new Promise((resolve) => setTimeout(() => resolve('still running'), 5_000))])
      expect(outcome).toEqual([0, null])
    } finally {
      child.kill('SIGKILL')
    }
  }, 30_000)
})
