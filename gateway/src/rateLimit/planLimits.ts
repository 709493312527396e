import type { GatewayConfig } from '../config/loadConfig.ts'
import type { ApiKeyRecord } from '../keys/keyRepository.ts'
import type { BanPolicy, WindowSpec } from './limitStore.ts'

export interface KeyLimits {
  minute: WindowSpec
  day: WindowSpec
}

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

type Plans = GatewayConfig['plans']
type LimitField = 'perMinute' | 'perDay'

/**
 * One of a key's limits, and whether it is the fail-safe one. The config must define free,
 * pro, business and enterprise, with "custom" only on enterprise (config/schema.ts), and the
 * keys CLI puts keys only on configured plans, so a key normally has its own limits or its
 * plan's. Two paths remain: a key row whose plan the config does not define (written by hand,
 * or on a plan since removed from the config), and an enterprise key without limits of its
 * own (created while enterprise had numbers). Those get the strictest limit any configured
 * plan has, never more than free's (free is required, with numbers), rather than a larger plan's.
 */
export function keyLimit(
  key: Pick<ApiKeyRecord, 'plan' | 'perMinute' | 'perDay'>,
  plans: Plans,
  field: LimitField,
): { limit: number; failSafe: boolean } {
  const custom = key[field]
  if (custom !== null) return { limit: custom, failSafe: false }
  const planned = Object.hasOwn(plans, key.plan) ? plans[key.plan]?.[field] : undefined
  if (typeof planned === 'number') return { limit: planned, failSafe: false }
  const limits = Object.values(plans).map((plan) => plan[field]).filter((limit) => typeof limit === 'number')
  // A validated config always has free's numbers; 1 guards a config built by hand without any.
  return { limit: limits.length > 0 ? Math.min(...limits) : 1, failSafe: true }
}

/**
 * A key's limits: its own custom limits when the row has them (the Enterprise plan's
 * "custom"), else its plan's (keyLimit).
 */
export function limitsFor(key: Pick<ApiKeyRecord, 'plan' | 'perMinute' | 'perDay'>, config: GatewayConfig): KeyLimits {
  return {
    minute: {
      limit: keyLimit(key, config.plans, 'perMinute').limit,
      windowMillis: config.windows.minute.lengthMillis,
      bucketMillis: config.windows.minute.bucketMillis,
    },
    day: {
      limit: keyLimit(key, config.plans, 'perDay').limit,
      windowMillis: config.windows.day.lengthMillis,
      bucketMillis: config.windows.day.bucketMillis,
    },
  }
}

/** Whether two keys' limits are the same numbers (identity first: the common case, from cachedLimitsFor). */
export function sameKeyLimits(a: KeyLimits, b: KeyLimits): boolean {
  return a === b || (sameWindow(a.minute, b.minute) && sameWindow(a.day, b.day))
}

const sameWindow = (a: WindowSpec, b: WindowSpec) => a.limit === b.limit && a.windowMillis === b.windowMillis && a.bucketMillis === b.bucketMillis

export const BAN_MEMORY_MILLIS = 86_400_000

const policies = new WeakMap<GatewayConfig, BanPolicy>()

export function banPolicy(config: GatewayConfig): BanPolicy {
  const known = policies.get(config)
  if (known) return known
  const policy: BanPolicy = {
    strikes: config.bans.strikes,
    ladderMillis: config.bans.ladderSeconds.map((seconds) => seconds * 1_000),
    memoryMillis: BAN_MEMORY_MILLIS,
  }
  policies.set(config, policy)
  return policy
}
