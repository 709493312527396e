import { hash, randomBytes, randomInt } from 'node:crypto'

/**
 * API key format: `aas_` + 32 base62 characters of randomness (~190 bits) + 6 base62 characters
 * of checksum over the random part. The readable prefix tells a user (and secret scanners) what
 * the string is; the checksum lets the gateway refuse a mistyped or invented key without a
 * database or Redis call.
 */
export const KEY_PREFIX = 'aas_'
const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
const BODY_LENGTH = 32
const CHECKSUM_LENGTH = 6
export const KEY_LENGTH = KEY_PREFIX.length + BODY_LENGTH + CHECKSUM_LENGTH
const SHAPE = new RegExp(`^${KEY_PREFIX}[0-9A-Za-z]{${BODY_LENGTH + CHECKSUM_LENGTH}}$`)

function randomBase62(length: number): string {
  let out = ''
  for (let i = 0; i < length; i++) out += ALPHABET[randomInt(ALPHABET.length)]
  return out
}

/** First 6 base62 digits of SHA-256 over the body: a mistyped character is caught 1 − 62⁻⁶ of the time. */
function checksum(body: string): string {
  const digest = hash('sha256', body, 'buffer')
  let value = digest.readUIntBE(0, 6)
  let out = ''
  for (let i = 0; i < CHECKSUM_LENGTH; i++) {
    out = ALPHABET[value % 62] + out
    value = Math.floor(value / 62)
  }
  return out
}

export function generateApiKey(): string {
  const body = randomBase62(BODY_LENGTH)
  return `${KEY_PREFIX}${body}${checksum(body)}`
}

/** True when the string has the key's prefix, length and alphabet; no hashing, no I/O. */
export function hasApiKeyShape(candidate: string): boolean {
  return candidate.length === KEY_LENGTH && SHAPE.test(candidate)
}

/** True when a string of the key's shape carries the checksum of its body; no I/O. */
export function hasValidChecksum(candidate: string): boolean {
  const body = candidate.slice(KEY_PREFIX.length, KEY_PREFIX.length + BODY_LENGTH)
  return candidate.slice(KEY_PREFIX.length + BODY_LENGTH) === checksum(body)
}

/** True when the string has the key shape and its checksum matches; no I/O. */
export function isWellFormedApiKey(candidate: string): boolean {
  return hasApiKeyShape(candidate) && hasValidChecksum(candidate)
}

/** What is stored and looked up: SHA-256 of the key. The keys are random, so no salt is needed. */
export function hashApiKey(key: string): Buffer {
  return hash('sha256', key, 'buffer')
}

/** The same hash as hex, in one step: the key cache's lookup key on every request. */
export function hashApiKeyHex(key: string): string {
  return hash('sha256', key, 'hex')
}

/** Enough of the key to recognise it in `keys list`, never enough to use it. */
export function displayPrefix(key: string): string {
  return key.slice(0, KEY_PREFIX.length + 6)
}

/** Public identifier of a key: safe in logs, metrics, Redis key names and upstream headers. */
export function generateKeyId(): string {
  return `key_${randomBytes(9).toString('base64url').replace(/[-_]/g, () => randomBase62(1))}`
}
