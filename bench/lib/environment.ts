import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { REPO_ROOT } from './childServer.ts'

export interface BenchEnvironment {
  node: string
  platform: string
  cpuModel: string
  cores: number
  memoryGiB: number
  autocannon: string
  gitCommit: string
  /** 1-minute load average when the run started; a busy machine skews everything. */
  loadAverageAtStart: number
}

function cpuModel(): string {
  try {
    const line = readFileSync('/proc/cpuinfo', 'utf8')
      .split('\n')
      .find((entry) => entry.startsWith('model name'))
    if (line) return line.slice(line.indexOf(':') + 1).trim()
  } catch {
    // Not Linux.
  }
  return os.cpus()[0]?.model ?? 'unknown'
}

function packageVersion(name: string): string {
  try {
    const manifest = JSON.parse(readFileSync(path.join(REPO_ROOT, 'node_modules', name, 'package.json'), 'utf8'))
    return String((manifest as { version?: unknown }).version ?? 'unknown')
  } catch {
    return 'unknown'
  }
}

function gitCommit(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: REPO_ROOT, encoding: 'utf8' }).trim()
    const dirty = execFileSync('git', ['status', '--porcelain'], { cwd: REPO_ROOT, encoding: 'utf8' }).trim() !== ''
    return dirty ? `${head} (with uncommitted changes)` : head
  } catch {
    return 'unknown'
  }
}

export function describeEnvironment(): BenchEnvironment {
  return {
    node: process.version,
    platform: `${os.type()} ${os.release()} ${os.arch()}`,
    cpuModel: cpuModel(),
    cores: os.availableParallelism(),
    memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    autocannon: packageVersion('autocannon'),
    gitCommit: gitCommit(),
    loadAverageAtStart: Math.round((os.loadavg()[0] ?? 0) * 100) / 100,
  }
}
