import { minimalPetsTarget } from './targets/minimalPets.ts'
import { petsServiceTarget } from './targets/petsService.ts'
import type { BenchTarget, ThroughputGoal } from './targets/types.ts'

/**
 * Everything `npm run bench` measures by default, one table row per target, in this order. To add
 * a row (say a gateway and a bare @fastify/http-proxy passthrough in front of the pets-service),
 * write a module in bench/targets/ and list it here; add a goal to compare two rows.
 */
export const TARGETS: BenchTarget[] = [
  petsServiceTarget({ id: 'pets-service', label: 'pets-service', logLevel: 'info' }),
  minimalPetsTarget,
]

/**
 * Experiments: run only when named in BENCH_TARGETS, e.g.
 * BENCH_TARGETS=pets-service,pets-service-log-warn,minimal-pets npm run bench
 */
export const OPTIONAL_TARGETS: BenchTarget[] = [
  petsServiceTarget({
    id: 'pets-service-log-warn',
    label: 'pets-service, LOG_LEVEL=warn (experiment)',
    logLevel: 'warn',
  }),
]

export const GOALS: ThroughputGoal[] = [{ subject: 'pets-service', baseline: 'minimal-pets', minRatio: 0.9 }]
