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

export function banPolicy(config: GatewayConfig): BanPolicy {
  return {
    strikes: config.bans.strikes,
    // DESIGN: strikes count within one minute window.
    strikeWindowMillis: config.windows.minute.lengthMillis,
    ladderMillis: config.bans.ladderSeconds.map((seconds) => seconds * 1_000),
    memoryMillis: BAN_MEMORY_MILLIS,
  }
}
