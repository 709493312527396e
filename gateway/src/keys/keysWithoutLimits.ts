import type { Logger } from 'pino'
import type { GatewayConfig } from '../config/loadConfig.ts'
import type { KeyRepository } from './keyRepository.ts'

/**
 * Says, at start and after each reload, which usable keys the config gives no limits: their plan
 * is not in it (a plan removed or renamed while keys still use it), or is `custom` and the key has
 * no limits of its own. Those keys get the strictest limits of any plan (planLimits.ts), which is
 * more than a removed plan stricter than free allowed, and nothing said so.
 */
export async function warnOfKeysWithoutLimits(repository: Pick<KeyRepository, 'usableWithoutLimits'>, config: GatewayConfig, logger: Pick<Logger, 'warn'>): Promise<void> {
  const defined = Object.keys(config.plans)
  const custom = defined.filter((plan) => config.plans[plan]!.perMinute === 'custom')
  let keys: Record<string, number>
  try {
    keys = await repository.usableWithoutLimits(defined, custom)
  } catch (error) {
    logger.warn({ err: error }, 'could not check which keys the config gives no limits')
    return
  }
  if (Object.keys(keys).length === 0) return
  logger.warn(
    { keys },
    'keys whose limits the config does not give (their plan is not in it, or is custom and the key has no limits of its own) get the strictest limits of any plan: ' +
      'define the plan again, or move them (npm run keys -- set-plan, set-limits)',
  )
}
