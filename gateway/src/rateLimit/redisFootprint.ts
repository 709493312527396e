import { generateKeyId } from '../keys/apiKeyFormat.ts'
import { limitKey } from './limitStore.ts'

/** DESIGN: one active key's windows, strikes and ban state may take at most this much of Redis (MEMORY USAGE). */
export const REDIS_BYTES_PER_KEY_BUDGET = 400

/** Bytes of one key's packed state (slidingWindowScript.ts's layout) for windows of the given bucket counts. */
export function packedStateBytes(minuteBuckets: number, dayBuckets: number): number {
  // The header with the minute ring's head (40), the minute ring of counts and strikes, the day ring's head and counts.
  return 40 + 8 * (minuteBuckets + 1) + 8 + 4 * (dayBuckets + 1)
}

/**
 * What Redis's MEMORY USAGE reports for a key holding a string of `valueBytes`: the value object
 * (16 bytes), its dictionary entry (24), and the key name and the value as SDS strings (a 3-byte
 * header under 256 bytes, 5 above, and a terminating zero), each in jemalloc's size class. Checked
 * against a real Redis in test/gateway/rateLimit/redisStore.int.test.ts.
 */
export function redisMemoryUsage(keyBytes: number, valueBytes: number): number {
  const sds = (length: number) => allocated((length < 256 ? 3 : 5) + length + 1)
  return 16 + 24 + sds(keyBytes) + sds(valueBytes)
}

/** jemalloc's size class for an allocation: 16-byte steps up to 128, then four classes per doubling. */
function allocated(bytes: number): number {
  if (bytes <= 8) return 8
  if (bytes <= 128) return Math.ceil(bytes / 16) * 16
  const step = 2 ** Math.floor(Math.log2(bytes - 1)) / 4
  return Math.ceil(bytes / step) * step
}

/** MEMORY USAGE of one active key's state under a key prefix and windows of these bucket counts. */
export function bytesPerActiveKey(keyPrefix: string, minuteBuckets: number, dayBuckets: number): number {
  const keyName = keyPrefix + limitKey(generateKeyId())
  return redisMemoryUsage(Buffer.byteLength(keyName), packedStateBytes(minuteBuckets, dayBuckets))
}
