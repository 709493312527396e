import { spawnSync } from 'node:child_process'
import { describe, expect, it } from 'vitest'

function checkConfig(...args: string[]) {
  return spawnSync(process.execPath, ['--import', 'tsx', 'gateway/src/cli/checkConfig.ts', ...args], {
    encoding: 'utf8',
    timeout: 30_000,
    env: { ...process.env, GATEWAY_CONFIG: '' },
  })
}

describe('npm run check-config', () => {
  it('accepts the shipped config and exits 0', () => {
    const run = checkConfig('config/gateway.yaml')
    expect(run.status, run.stderr).toBe(0)
    expect(run.stdout).toMatch(/^config\/gateway\.yaml: valid \(plans: free, pro, business, enterprise/)
  })

  it('names the file, line and key of each problem and exits 1', () => {
    const run = checkConfig('test/fixtures/config/bad-window.yaml')
    expect(run.status).toBe(1)
    expect(run.stdout).toBe('')
    expect(run.stderr.trim().split('\n')).toEqual([
      'test/fixtures/config/bad-window.yaml:8: windows.minute.bucket must divide the window length',
      'test/fixtures/config/bad-window.yaml:9: windows.day.bucket must leave at most 60 buckets in the window',
    ])
  })

  it('says plainly when the file does not exist', () => {
    const run = checkConfig('config/missing.yaml')
    expect(run.status).toBe(1)
    expect(run.stderr.trim()).toBe('config/missing.yaml: cannot be read (ENOENT)')
  })
})
