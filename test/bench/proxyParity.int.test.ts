import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { describe, expect, it } from 'vitest'

const run = promisify(execFile)

describe('bench/tools/proxyParity.ts', () => {
  it('finds the proxy stage differing from the pre-tuning reply-from stage only where it was meant to, on all 44 raw requests', async () => {
    // Without --before it compares with bench/experiments/upstreamProxyReplyFrom.ts; exit 1 on any
    // difference it does not know, so a change to the stage that alters bytes on the wire shows here.
    const { stdout } = await run(process.execPath, ['--import', 'tsx', 'bench/tools/proxyParity.ts'], { timeout: 120_000 })
    expect(stdout).toContain('44 requests, 0 unexpected differences')
    expect(stdout).not.toMatch(/^DIFFERENT/m)
  }, 150_000)
})
