import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
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
      'test/fixtures/config/bad-window.yaml:11: windows.minute.bucket must divide the window length',
      'test/fixtures/config/bad-window.yaml:12: windows.day.bucket must leave at most 60 buckets in the window',
    ])
  })

  it('checks every file it is given and exits 1 when any of them is invalid', () => {
    const run = checkConfig('config/gateway.yaml', 'test/fixtures/config/bad-window.yaml')
    expect(run.status).toBe(1)
    expect(run.stdout).toMatch(/^config\/gateway\.yaml: valid/)
    expect(run.stderr).toContain('test/fixtures/config/bad-window.yaml:11: windows.minute.bucket must divide the window length')
  })

  it('answers --help with its usage, and an unknown option with its usage and exit 2', () => {
    const help = checkConfig('--help')
    expect(help.status).toBe(0)
    expect(help.stdout).toMatch(/^usage: npm run check-config/)
    const unknown = checkConfig('--strict', 'config/gateway.yaml')
    expect(unknown.status).toBe(2)
    expect(unknown.stderr).toMatch(/^unknown option --strict\nusage:/)
  })

  it('says plainly when the file does not exist, and where a relative path was looked for', () => {
    const run = checkConfig('config/missing.yaml')
    expect(run.status).toBe(1)
    expect(run.stderr.trim()).toBe(`config/missing.yaml: cannot be read (ENOENT, looked for in ${process.cwd()})`)
  })

  it('reads a relative path from the directory `npm run check-config` was typed in, not the package root npm runs it from', () => {
    // npm runs every script from the package's directory and says where it was typed in INIT_CWD.
    const typedIn = mkdtempSync(path.join(os.tmpdir(), 'check-config-'))
    try {
      writeFileSync(path.join(typedIn, 'staging.yaml'), readFileSync('config/gateway.yaml', 'utf8'))
      const env = { ...process.env, GATEWAY_CONFIG: '', INIT_CWD: typedIn, npm_lifecycle_event: 'check-config' }
      const run = spawnSync(process.execPath, ['--import', 'tsx', 'gateway/src/cli/checkConfig.ts', 'staging.yaml'], { encoding: 'utf8', timeout: 30_000, env })
      expect(run.stderr).toBe('')
      expect(run.status).toBe(0)
      expect(run.stdout).toMatch(/^staging\.yaml: valid \(plans: free, pro, business, enterprise/)
      // The package's own file, given relative to the package root, is not what was typed there.
      const shipped = spawnSync(process.execPath, ['--import', 'tsx', 'gateway/src/cli/checkConfig.ts', 'config/gateway.yaml'], { encoding: 'utf8', timeout: 30_000, env })
      expect(shipped.status).toBe(1)
      expect(shipped.stderr.trim()).toBe(`config/gateway.yaml: cannot be read (ENOENT, looked for in ${typedIn})`)
    } finally {
      rmSync(typedIn, { recursive: true, force: true })
    }
  })

  it('names each trusted proxy the gateway could not use, with its line, and exits 1', () => {
    const run = checkConfig('test/fixtures/config/bad-trusted-proxies.yaml')
    expect(run.status).toBe(1)
    expect(run.stdout).toBe('')
    const lines = run.stderr.trim().split('\n')
    expect(lines).toHaveLength(8)
    expect(lines[0]).toBe(
      'test/fixtures/config/bad-trusted-proxies.yaml:8: server.trustedProxies.1 must be an IP address, ' +
        'a CIDR range (10.0.0.0/8) or one of loopback, linklocal, uniquelocal (invalid IP address: 999.1.1.1)',
    )
    expect(lines[1]).toMatch(/^test\/fixtures\/config\/bad-trusted-proxies\.yaml:9: server\.trustedProxies\.2 must be .*10\.0\.0\.0\/33\)$/)
    expect(lines[4]).toMatch(/^test\/fixtures\/config\/bad-trusted-proxies\.yaml:15: server\.trustedProxies\.8 must be .*\(192\.168\.010\.005 would be read as 192\.168\.8\.5: /)
  })

  it('names each listener address and URL the gateway could not use at its next start, with its line, and exits 1', () => {
    const run = checkConfig('test/fixtures/config/bad-addresses.yaml')
    expect(run.status).toBe(1)
    expect(run.stdout).toBe('')
    const invalidUrl = 'must be a valid http:// or https:// URL (is the port 1-65535? is every [ closed?)'
    expect(run.stderr.trim().split('\n')).toEqual([
      'test/fixtures/config/bad-addresses.yaml:2: server.host must be an IP address or a host name; a port goes in its own setting',
      'test/fixtures/config/bad-addresses.yaml:4: server.opsHost must be an IP address or a host name; an IPv6 address takes no brackets here',
      `test/fixtures/config/bad-addresses.yaml:7: upstreams.pets.url ${invalidUrl}`,
      `test/fixtures/config/bad-addresses.yaml:8: upstreams.orders.url ${invalidUrl}`,
    ])
  })

  it('names a plan the config leaves out and exits 1', () => {
    const run = checkConfig('test/fixtures/config/bad-plans.yaml')
    expect(run.status).toBe(1)
    expect(run.stderr.split('\n')[0]).toBe('test/fixtures/config/bad-plans.yaml:5: plans.free is required')
  })

  it("prints exactly the README's example for a mistyped limit", () => {
    const readme = readFileSync('README.md', 'utf8')
    const example = /```\n\$ npm run -s check-config -- config\/gateway\.yaml\n([^`]*)```/.exec(readme)?.[1]
    expect(example, 'the check-config example in README.md').toBeDefined()
    const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-check-config-'))
    try {
      const file = path.join(directory, 'gateway.yaml')
      const shipped = readFileSync('config/gateway.yaml', 'utf8')
      const mistyped = shipped.replace('pro:        { perMinute:', 'pro:        { perMinut:')
      expect(mistyped).not.toBe(shipped)
      writeFileSync(file, mistyped)
      const run = checkConfig(file)
      expect(run.status).toBe(1)
      expect(run.stdout).toBe('')
      expect(run.stderr.replaceAll(file, 'config/gateway.yaml')).toBe(example)
    } finally {
      rmSync(directory, { recursive: true, force: true })
    }
  })
})
