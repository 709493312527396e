import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { bearerToken } from '../../gateway/src/auth/authenticate.ts'
import {
  KEY_LENGTH,
  displayPrefix,
  generateApiKey,
  generateKeyId,
  hashApiKey,
  isWellFormedApiKey,
} from '../../gateway/src/keys/apiKeyFormat.ts'

describe('API keys', () => {
  it('carry a readable prefix, 190 bits of randomness and a checksum that verifies', () => {
    const key = generateApiKey()
    expect(key).toMatch(/^aas_[0-9A-Za-z]{38}$/)
    expect(key).toHaveLength(KEY_LENGTH)
    expect(isWellFormedApiKey(key)).toBe(true)
  })

  it('are never the same twice', () => {
    const keys = new Set(Array.from({ length: 1_000 }, generateApiKey))
    expect(keys.size).toBe(1_000)
  })

  it('fail the checksum when any single character is changed', () => {
    const key = generateApiKey()
    fc.assert(
      fc.property(fc.integer({ min: 4, max: KEY_LENGTH - 1 }), fc.constantFrom(...'0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'), (index, replacement) => {
        fc.pre(key[index] !== replacement)
        const typo = key.slice(0, index) + replacement + key.slice(index + 1)
        expect(isWellFormedApiKey(typo)).toBe(false)
      }),
      { numRuns: 500 },
    )
  })

  it.each(['', 'aas_', 'Bearer x', generateApiKey().toLowerCase(), `${generateApiKey()}x`, 'aas_' + '!'.repeat(38)])(
    'refuse the malformed string %j',
    (candidate) => {
      expect(isWellFormedApiKey(candidate)).toBe(false)
    },
  )

  it('are stored as a 32-byte SHA-256 hash and shown by a prefix too short to use', () => {
    const key = generateApiKey()
    expect(hashApiKey(key)).toHaveLength(32)
    expect(displayPrefix(key)).toBe(key.slice(0, 10))
  })

  it('have public ids safe for logs and Redis key names', () => {
    expect(generateKeyId()).toMatch(/^key_[0-9A-Za-z]{12}$/)
  })
})

describe('the bearer token of an Authorization value', () => {
  it.each([
    ['Bearer abc', 'abc'],
    ['bearer abc', 'abc'],
    ['BEARER   abc   ', 'abc'],
    ['Bearer', ''],
    ['Bearer    ', ''],
    ['Bearer abc def', undefined],
    ['Bearerabc', undefined],
    ['Bearer\tabc', undefined],
    [' Bearer abc', undefined],
    ['Basic abc', undefined],
  ])('%j → %j', (value, token) => {
    expect(bearerToken(value)).toBe(token)
  })

  it('reads past 16,000 spaces (a header of the largest size Node takes) to find two tokens', () => {
    expect(bearerToken(`Bearer${' '.repeat(16_000)}abc def`)).toBeUndefined()
    expect(bearerToken(`Bearer${' '.repeat(16_000)}abc${' '.repeat(16_000)}`)).toBe('abc')
  })
})
