import type { GatewayConfig } from '../config/loadConfig.ts'
import type { ApiKeyRecord } from '../keys/keyRepository.ts'
import type { BanPolicy, WindowSpec } from './limitStore.ts'

export interface KeyLimits {
  minute: WindowSpec
  day: WindowSpec
}

/**
 * A key's limits: its own custom limits when the row has them (the Enterprise plan's
 * "custom"), else its plan's. A plan missing from config, or "custom" without limits on the
 * row, falls back to the smallest configured limit rather than to none.
 */
const computed = new WeakMap<object, { config: GatewayConfig; limits: KeyLimits }>()

/**
 * limitsFor, remembered per key record and config: records come from the key cache and configs
 * are replaced whole on reload, so identity says when to compute again.
 */
export function cachedLimitsFor(key: ApiKeyRecord, config: GatewayConfig): KeyLimits {
  const known = computed.get(key)
  if (known && known.config === config) return known.limits
  const limits = limitsFor(key, config)
  computed.set(key, { config, limits })
  return limits
}

export function limitsFor(key: Pick<ApiKeyRecord, 'plan' | 'perMinute' | 'perDay'>, config: GatewayConfig): KeyLimits {
  const plan = config.plans[key.plan]
  const smallest = (field: 'perMinute' | 'perDay') =>
    Math.min(...Object.values(config.plans).map((entry) => (typeof entry[field] === 'number' ? entry[field] : Infinity)))
  const pick = (field: 'perMinute' | 'perDay', custom: number | null) => {
    if (custom !== null) return custom
    const planned = plan?.[field]
    return typeof planned === 'number' ? planned : smallest(field)
  }
  return {
    minute: {
      limit: pick('perMinute', key.perMinute),
      windowMillis: config.windows.minute.lengthMillis,
      bucketMillis: config.windows.minute.bucketMillis,
    },
    day: {
      limit: pick('perDay', key.perDay),
      windowMillis: config.windows.day.lengthMillis,
      bucketMillis: config.windows.day.bucketMillis,
    },
  }
}

export const BAN_MEMORY_MILLIS = 86_400_000

const policies = new WeakMap<GatewayConfig, BanPolicy>()

export function banPolicy(config: GatewayConfig): BanPolicy {
  const known = policies.get(config)
  if (known) return known
  const policy: BanPolicy = {
    strikes: config.bans.strikes,
    // DESIGN: strikes count within one minute window.
    strikeWindowMillis: config.windows.minute.lengthMillis,
    ladderMillis: config.bans.ladderSeconds.map((seconds) => seconds * 1_000),
    memoryMillis: BAN_MEMORY_MILLIS,
  }
  policies.set(config, policy)
  return policy
}
