import { spawnSync } from 'node:child_process'
import { describe, expect, it } from 'vitest'

describe('a service told to stop as it begins listening', () => {
  // Regression: the start watch was stopped before the shutdown's listeners were added; Node then
  // stopped watching SIGTERM and dropped the one already caught, and the service ran on (npm start
  // killed it 15 s later and exited 1).
  it('stops: a SIGTERM caught while the start watch hands over to the shutdown is the shutdown\'s', () => {
    const run = spawnSync(process.execPath, ['--import', 'tsx', 'test/fixtures/lifecycle/sigtermAtHandover.ts'], { encoding: 'utf8', timeout: 20_000 })
    expect(run.stdout).toBe('shutdown ran\n')
    expect(run.status).toBe(0)
  })
})
