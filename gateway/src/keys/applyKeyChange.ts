import type { Logger } from 'pino'
import type { Limiter } from '../rateLimit/limiter.ts'
import type { KeyCache } from './keyCache.ts'
import type { KeyChange } from './keyRepository.ts'

/**
 * What a gateway does with one entry of the key change log: forget the cached key, and for an
 * operator's unban, lift the ban in the local ban cache and in the rate-limit store.
 */
export function keyChangeHandler(keys: KeyCache, limiter: Limiter, logger: Logger): (change: KeyChange) => void {
  return (change) => {
    keys.invalidate(change.keyHash)
    if (change.kind !== 'unban') return
    limiter.bans.forget(change.keyId)
    limiter.store
      .unban(change.keyId)
      .then(() => logger.info({ keyId: change.keyId }, 'API key unbanned'))
      .catch((error: unknown) => logger.error({ err: error, keyId: change.keyId }, 'unban failed'))
  }
}
