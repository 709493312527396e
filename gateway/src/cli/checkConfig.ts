import { ConfigError, DEFAULT_CONFIG_PATH, loadGatewayConfig } from '../config/loadConfig.ts'

/**
 * `npm run check-config [-- path]`: the gateway's own validation, offline. Prints every
 * problem as file:line: key message and exits 1, or says the file is valid and exits 0.
 */
const path = process.argv[2] ?? process.env.GATEWAY_CONFIG ?? DEFAULT_CONFIG_PATH
try {
  const config = loadGatewayConfig(path, {})
  const plans = Object.keys(config.plans).join(', ')
  console.log(`${path}: valid (plans: ${plans}; onStoreFailure: ${config.onStoreFailure})`)
} catch (error) {
  if (!(error instanceof ConfigError)) throw error
  for (const problem of error.problems) console.error(problem)
  process.exit(1)
}
