import { afterAll, describe, expect, it } from 'vitest'
import { TOKEN, baseEnv, exitWithin, killAll, startNode } from './processes.ts'

afterAll(async () => {
  await killAll()
})

describe('a service started without what it needs', () => {
  it.each([
    ['gateway/src/main.ts', 'gateway', { INTERNAL_TOKEN: TOKEN }, 'DATABASE_URL must be set'],
    ['pets-service/src/main.ts', 'pets-service', { INTERNAL_TOKEN: TOKEN }, 'DATABASE_URL must be set'],
    ['pets-service/src/main.ts', 'pets-service', { DATABASE_URL: 'postgres://127.0.0.1:1/none', INTERNAL_TOKEN: TOKEN, PETS_PORT: 'eighty' }, 'PETS_PORT must be a port number'],
  ])('%s exits 1 saying what is missing in one line, without a stack trace', async (script, service, env, problem) => {
    const { DATABASE_URL: _url, ...inherited } = baseEnv()
    const started = startNode(script, { ...inherited, ...env })
    const { code } = await exitWithin(started, 30_000)
    expect(code).toBe(1)
    const output = started.output()
    expect(output).toContain(`${service} cannot start: ${problem}`)
    expect(output).not.toMatch(/\n\s+at /)
  })
})
