import { ConfigError, DEFAULT_CONFIG_PATH, loadGatewayConfig } from '../config/loadConfig.ts'

/**
 * `npm run check-config [-- path …]`: the gateway's own validation, offline. For each file, prints
 * every problem as file:line: key message, or says the file is valid; exits 1 when any file is not
 * (so `check-config -- config/*.yaml` in CI fails on one broken file among several).
 */
const USAGE = 'usage: npm run check-config -- [file.yaml …]   (default: $GATEWAY_CONFIG, else config/gateway.yaml)'

const args = process.argv.slice(2)
if (args.includes('--help') || args.includes('-h')) {
  console.log(USAGE)
  process.exit(0)
}
const options = args.filter((arg) => arg.startsWith('-'))
if (options.length > 0) {
  console.error(`unknown option ${options.join(', ')}\n${USAGE}`)
  process.exit(2)
}
const paths = args.length > 0 ? args : [process.env.GATEWAY_CONFIG || DEFAULT_CONFIG_PATH]
/**
 * npm runs a script from the package's directory and names the one it was typed in as INIT_CWD: a
 * file given on the command line is read from there (`cd config && npm run check-config -- staging.yaml`).
 * GATEWAY_CONFIG is read as the gateway reads it, from the directory the process runs in.
 */
const typedIn = args.length > 0 && process.env.npm_lifecycle_event === 'check-config' ? process.env.INIT_CWD : undefined
let invalid = false
for (const path of paths) {
  try {
    const config = loadGatewayConfig(path, {}, typedIn || process.cwd())
    const plans = Object.keys(config.plans).join(', ')
    console.log(`${path}: valid (plans: ${plans}; onStoreFailure: ${config.onStoreFailure})`)
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error
    for (const problem of error.problems) console.error(problem)
    invalid = true
  }
}
process.exit(invalid ? 1 : 0)
