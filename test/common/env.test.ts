import { describe, expect, it } from 'vitest'
import { internalTokenFromEnv, portFromEnv } from '../../common/src/env.ts'

describe('environment the services read at boot', () => {
  it('refuses to start either service on a missing or short INTERNAL_TOKEN, naming it', () => {
    expect(() => internalTokenFromEnv({})).toThrow('INTERNAL_TOKEN must be set')
    expect(() => internalTokenFromEnv({ INTERNAL_TOKEN: '123456789012345' })).toThrow('INTERNAL_TOKEN must be at least 16 characters')
    expect(internalTokenFromEnv({ INTERNAL_TOKEN: '1234567890123456' })).toBe('1234567890123456')
  })

  it('reads a port, falls back when it is unset, and refuses one that is not a port', () => {
    expect(portFromEnv('P', 8080, { P: '9000' })).toBe(9000)
    expect(portFromEnv('P', 8080, {})).toBe(8080)
    expect(() => portFromEnv('P', 8080, { P: '70000' })).toThrow('P must be a port number between 0 and 65535, got "70000"')
  })
})
