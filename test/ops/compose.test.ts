import { execFile } from 'node:child_process'
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs'
import { createServer } from 'node:http'
import { builtinModules } from 'node:module'
import path from 'node:path'
import { promisify } from 'node:util'
import { parse } from 'yaml'
import { describe, expect, it } from 'vitest'
import { parseGatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import { canListen } from '../helpers/ports.ts'
import { DASHBOARD_FILE } from './promql.ts'

/**
 * No Docker engine runs on these machines, so docker-compose.yml and the Dockerfile are checked
 * by reading them: their services, ports, env vars and mounted paths must agree with the code and
 * the config files, and every file the image's CMD needs must be in the image.
 */

interface Healthcheck {
  test: string[] | string
}
interface Service {
  image?: string
  build?: string
  command?: string[]
  environment?: Record<string, string>
  volumes?: string[]
  ports?: string[]
  healthcheck?: Healthcheck
  depends_on?: Record<string, { condition: string }>
}

const compose = parse(readFileSync('docker-compose.yml', 'utf8'), { merge: true }) as { services: Record<string, Service> }
const services = compose.services
const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as { dependencies: Record<string, string>; devDependencies: Record<string, string> }
const gatewayFile = parseGatewayConfig(readFileSync('config/gateway.yaml', 'utf8'))

const GATEWAY_MAIN = 'gateway/src/main.ts'
const PETS_MAIN = 'pets-service/src/main.ts'
/** The script a `node --import tsx <script>` service runs. */
const entryOf = (service: Service) => (service.command?.[0] === 'node' ? service.command.at(-1) : undefined)
const gateways = Object.entries(services).filter(([, service]) => entryOf(service) === GATEWAY_MAIN)
const env = (name: string) => services[name]?.environment ?? {}

/** Environment variables the services' code reads, found in its source. */
function envReadByCode(): Set<string> {
  const names = new Set<string>()
  const walk = (directory: string) => {
    for (const entry of readdirSync(directory)) {
      const file = path.join(directory, entry)
      if (statSync(file).isDirectory()) walk(file)
      else if (file.endsWith('.ts')) {
        const text = readFileSync(file, 'utf8')
        for (const match of text.matchAll(/\benv\.([A-Z][A-Z0-9_]*)|(?:requiredEnv|portFromEnv|listenHostFromEnv)\('([A-Z][A-Z0-9_]*)'/g)) names.add(match[1] ?? match[2]!)
      }
    }
  }
  for (const directory of ['gateway/src', 'pets-service/src', 'common/src']) walk(directory)
  return names
}

/** `./host:/container[:ro]` → the host path (relative to the repository) and the container path. */
function mounts(service: Service): { host: string; target: string }[] {
  return (service.volumes ?? [])
    .map((volume) => volume.split(':'))
    .filter(([host]) => host!.startsWith('./'))
    .map(([host, target]) => ({ host: path.normalize(host!), target: target! }))
}

/** Where a container path comes from on the host, through the service's bind mounts. */
function hostPathOf(service: Service, containerPath: string): string | undefined {
  for (const { host, target } of mounts(service)) {
    if (containerPath === target || containerPath.startsWith(`${target}/`)) return path.join(host, path.relative(target, containerPath))
  }
  return undefined
}

function healthcheckCommand(service: Service): string {
  const test = service.healthcheck?.test
  return Array.isArray(test) ? test.join(' ') : (test ?? '')
}

describe('docker-compose.yml', () => {
  it('has the whole stack: Postgres, Redis, the pets-service, two gateways, Prometheus, Grafana', () => {
    expect(Object.keys(services).sort()).toEqual(['gateway-1', 'gateway-2', 'grafana', 'pets-service', 'postgres', 'prometheus', 'redis'])
    expect(gateways.map(([name]) => name).sort()).toEqual(['gateway-1', 'gateway-2'])
    expect(entryOf(services['pets-service']!)).toBe(PETS_MAIN)
    for (const name of ['gateway-1', 'gateway-2', 'pets-service']) {
      expect(services[name]!.build, name).toBe('.')
      // node itself, not npm or a shell, so SIGTERM and SIGHUP reach the process.
      expect(services[name]!.command?.slice(0, 3), name).toEqual(['node', '--import', 'tsx'])
      expect(existsSync(entryOf(services[name]!)!), name).toBe(true)
    }
  })

  it('every service others depend on has a healthcheck, and the app services wait for healthy dependencies', () => {
    for (const [name, service] of Object.entries(services)) {
      for (const [dependency, { condition }] of Object.entries(service.depends_on ?? {})) {
        expect(services[dependency], `${name} depends on an existing service ${dependency}`).toBeDefined()
        expect(services[dependency]!.healthcheck, `${dependency} (a dependency of ${name}) has a healthcheck`).toBeDefined()
        expect(condition, `${name} → ${dependency}`).toBe('service_healthy')
      }
    }
    for (const [name] of gateways) expect(Object.keys(services[name]!.depends_on ?? {}).sort(), name).toEqual(['pets-service', 'postgres', 'redis'])
    expect(Object.keys(services['pets-service']!.depends_on ?? {})).toEqual(['postgres'])
    expect(Object.keys(services.grafana!.depends_on ?? {})).toEqual(['prometheus'])
  })

  it('the app healthchecks ask each process\'s own /readyz on its ops port', () => {
    for (const [name] of gateways) {
      const opsPort = env(name).GATEWAY_OPS_PORT ?? String(gatewayFile.server.opsPort)
      expect(healthcheckCommand(services[name]!), name).toContain(`http://127.0.0.1:${opsPort}/readyz`)
      expect(env(name).GATEWAY_OPS_HOST, `${name} ops port reachable by Prometheus`).toBe('0.0.0.0')
    }
    const pets = env('pets-service')
    expect(healthcheckCommand(services['pets-service']!)).toContain(`http://127.0.0.1:${pets.PETS_OPS_PORT ?? '9465'}/readyz`)
    expect(pets.PETS_OPS_HOST).toBe('0.0.0.0')
    expect(pets.PETS_HOST, 'the gateways reach the pets-service across the compose network').toBe('0.0.0.0')
  })

  it('sets only environment variables the code reads, and every one the services require', () => {
    // PGPASSWORD is read by pg itself, for a DATABASE_URL without a password.
    const read = new Set([...envReadByCode(), 'PGPASSWORD'])
    for (const name of ['gateway-1', 'gateway-2', 'pets-service']) {
      for (const variable of Object.keys(env(name))) expect(read.has(variable), `${name}: ${variable} is read by the code`).toBe(true)
    }
    for (const [name] of gateways) {
      for (const variable of ['DATABASE_URL', 'REDIS_URL', 'INTERNAL_TOKEN', 'PETS_URL', 'GATEWAY_CONFIG']) {
        expect(env(name)[variable], `${name}: ${variable}`).toBeTruthy()
      }
    }
    for (const variable of ['DATABASE_URL', 'INTERNAL_TOKEN']) expect(env('pets-service')[variable], variable).toBeTruthy()
  })

  it('wires the services to each other by compose service names and the ports they listen on', () => {
    const postgres = env('postgres')
    const pets = env('pets-service')
    for (const [name] of [...gateways, ['pets-service']] as [string][]) {
      const own = env(name)
      expect(own.DATABASE_URL, name).toBe(pets.DATABASE_URL)
      expect(own.INTERNAL_TOKEN, `${name} and the pets-service share one credential`).toBe(pets.INTERNAL_TOKEN)
      // Documented default for local use only, overridable from the environment.
      const token = /^\$\{INTERNAL_TOKEN:-(.+)\}$/.exec(own.INTERNAL_TOKEN ?? '')
      expect(token?.[1]?.length, `${name}: INTERNAL_TOKEN comes from the environment with a local default of ≥ 16 characters`).toBeGreaterThanOrEqual(16)
    }
    const database = new URL(pets.DATABASE_URL!)
    expect(database.hostname).toBe('postgres')
    expect(database.port || '5432').toBe('5432')
    expect(database.username).toBe(postgres.POSTGRES_USER)
    expect(database.pathname).toBe(`/${postgres.POSTGRES_DB}`)
    // Not inside the URL, where a generated password's `/`, `@`, `#` or `%` would break it or be decoded.
    expect(database.password, 'no password in DATABASE_URL').toBe('')
    for (const [name] of [...gateways, ['pets-service']] as [string][]) {
      expect(env(name).PGPASSWORD, `${name}: the password Postgres was given`).toBe(postgres.POSTGRES_PASSWORD)
    }
    for (const [name] of gateways) {
      const own = env(name)
      expect(new URL(own.REDIS_URL!).host, name).toBe('redis:6379')
      expect(own.PETS_URL, name).toBe(`http://pets-service:${pets.PETS_PORT ?? '3001'}`)
    }
  })

  it('publishes each gateway on its own host port, mapped to the port it listens on, and no host port twice', () => {
    const published = Object.values(services).flatMap((service) => service.ports ?? [])
    const hostSide = published.map((mapping) => mapping.split(':').slice(0, -1).join(':'))
    expect(new Set(hostSide).size).toBe(hostSide.length)
    const gatewayHostPorts = gateways.map(([name, service]) => {
      expect(service.ports, name).toHaveLength(1)
      const [hostPort, containerPort] = service.ports![0]!.split(':').slice(-2)
      expect(containerPort, name).toBe(env(name).GATEWAY_PORT ?? String(gatewayFile.server.port))
      return hostPort
    })
    expect(new Set(gatewayHostPorts).size).toBe(gateways.length)
    expect(services['pets-service']!.ports, 'the pets-service is reached only through the gateways').toBeUndefined()
  })

  it('mounts config/ into both gateways, so plans change without a rebuild, and GATEWAY_CONFIG names a valid file there', () => {
    for (const [name, service] of gateways) {
      expect(mounts(service).map((mount) => mount.host), name).toContain('config')
      const host = hostPathOf(service, env(name).GATEWAY_CONFIG!)
      expect(host, `${name}: GATEWAY_CONFIG is inside a mounted directory`).toBeDefined()
      expect(() => parseGatewayConfig(readFileSync(host!, 'utf8'), host)).not.toThrow()
    }
  })

  it('gives Prometheus the scrape config and rules, scraping both gateways and the pets-service on their ops ports', () => {
    const prometheus = services.prometheus!
    const configFlag = prometheus.command?.find((flag) => flag.startsWith('--config.file='))?.split('=')[1]
    const configOnHost = hostPathOf(prometheus, configFlag!)
    expect(configOnHost).toBe(path.normalize('config/prometheus/prometheus.yml'))
    const config = parse(readFileSync(configOnHost!, 'utf8')) as {
      rule_files: string[]
      scrape_configs: { job_name: string; static_configs: { targets: string[] }[] }[]
    }
    for (const file of config.rule_files) expect(existsSync(path.join(path.dirname(configOnHost!), file)), file).toBe(true)
    const targets = Object.fromEntries(config.scrape_configs.map((job) => [job.job_name, job.static_configs.flatMap((c) => c.targets).sort()]))
    expect(targets.gateway).toEqual(gateways.map(([name]) => `${name}:${env(name).GATEWAY_OPS_PORT ?? gatewayFile.server.opsPort}`).sort())
    expect(targets['pets-service']).toEqual([`pets-service:${env('pets-service').PETS_OPS_PORT ?? '9465'}`])
    expect(targets.prometheus).toEqual(['localhost:9090'])
    expect(healthcheckCommand(prometheus)).toContain('http://127.0.0.1:9090/-/ready')
  })

  it('provisions Grafana with the Prometheus datasource and the dashboard from config/grafana', () => {
    const grafana = services.grafana!
    const provisioning = hostPathOf(grafana, '/etc/grafana/provisioning')
    expect(provisioning).toBe(path.normalize('config/grafana/provisioning'))
    const datasources = parse(readFileSync(path.join(provisioning!, 'datasources/prometheus.yml'), 'utf8')) as {
      datasources: { uid: string; type: string; url: string }[]
    }
    expect(datasources.datasources).toHaveLength(1)
    const [datasource] = datasources.datasources
    expect(datasource!.type).toBe('prometheus')
    expect(datasource!.url).toBe('http://prometheus:9090')
    const providers = parse(readFileSync(path.join(provisioning!, 'dashboards/dashboards.yml'), 'utf8')) as {
      providers: { type: string; options: { path: string } }[]
    }
    const dashboardsOnHost = hostPathOf(grafana, providers.providers[0]!.options.path)
    expect(dashboardsOnHost).toBe(path.dirname(DASHBOARD_FILE))
    expect(hostPathOf(grafana, grafana.environment?.GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH ?? '')).toBe(DASHBOARD_FILE)
    // Every datasource the dashboard names is the provisioned one.
    const uids = [...readFileSync(DASHBOARD_FILE, 'utf8').matchAll(/"datasource":\s*\{\s*"type":\s*"(\w+)",\s*"uid":\s*"([^"]+)"/g)]
    expect(uids.length).toBeGreaterThan(0)
    for (const [, type, uid] of uids) expect({ type, uid }).toEqual({ type: 'prometheus', uid: datasource!.uid })
  })
})

// ---------------------------------------------------------------------------------------------

interface Instruction {
  keyword: string
  args: string
}

/** Dockerfile instructions, continuation lines joined, comments dropped. */
function instructions(text: string): Instruction[] {
  const joined = text
    .split('\n')
    .filter((line) => !line.trimStart().startsWith('#'))
    .join('\n')
    .replace(/\\\n/g, ' ')
  return joined
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean)
    .map((line) => {
      const [keyword, ...rest] = line.split(/\s+/)
      return { keyword: keyword!.toUpperCase(), args: rest.join(' ') }
    })
}

function stages(all: Instruction[]): { from: string; name: string; body: Instruction[] }[] {
  const result: { from: string; name: string; body: Instruction[] }[] = []
  for (const instruction of all) {
    if (instruction.keyword === 'FROM') {
      const [from, as, name] = instruction.args.split(/\s+/)
      result.push({ from: from!, name: as?.toUpperCase() === 'AS' ? name! : String(result.length), body: [] })
    } else result.at(-1)?.body.push(instruction)
  }
  return result
}

/** COPY sources of a stage, `--from` copies apart. */
function copies(body: Instruction[]): { from?: string; sources: string[]; target: string }[] {
  return body
    .filter((instruction) => instruction.keyword === 'COPY')
    .map((instruction) => {
      const words = instruction.args.split(/\s+/)
      const from = words.find((word) => word.startsWith('--from='))?.slice('--from='.length)
      const paths = words.filter((word) => !word.startsWith('--'))
      return { from, sources: paths.slice(0, -1), target: paths.at(-1)! }
    })
}

/** Every repository file reached by static imports from `entries`, and the packages they import at run time. */
function importGraph(entries: string[]): { files: Set<string>; packages: Set<string> } {
  const files = new Set<string>()
  const packages = new Set<string>()
  const visit = (file: string) => {
    if (files.has(file)) return
    files.add(file)
    const text = readFileSync(file, 'utf8')
    // `createRequire(…).resolve('pkg/…')` finds a package's files at run time (swagger-ui-dist's) without importing it.
    for (const match of text.matchAll(/^\s*(import|export)\s+(type\s+)?(?:[\w*{}\s,$]+?\s+from\s+)?['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)|\.resolve\(\s*['"]([^'"]+)['"]\s*\)/gm)) {
      const typeOnly = Boolean(match[2])
      const specifier = match[3] ?? match[4] ?? match[5]!
      // A type-only import is erased before the code runs: neither its file nor its package is loaded.
      if ((match[5] && specifier.startsWith('.')) || typeOnly) continue
      if (specifier.startsWith('.')) visit(path.normalize(path.join(path.dirname(file), specifier)))
      else if (!specifier.startsWith('node:') && !builtinModules.includes(specifier)) {
        packages.add(specifier.startsWith('@') ? specifier.split('/').slice(0, 2).join('/') : specifier.split('/')[0]!)
      }
    }
  }
  entries.forEach(visit)
  return { files, packages }
}

/** .dockerignore patterns (no negations used here) as a predicate on repository paths. */
function dockerIgnored(): (file: string) => boolean {
  const patterns = readFileSync('.dockerignore', 'utf8')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line && !line.startsWith('#'))
  expect(patterns.some((pattern) => pattern.startsWith('!')), '.dockerignore negations are not modelled here').toBe(false)
  const regexes = patterns.map(
    (pattern) =>
      new RegExp(
        `^${pattern
          .replace(/^\/|\/$/g, '')
          .replace(/[.+^${}()|[\]\\]/g, '\\$&')
          .replace(/\*\*/g, '§')
          .replace(/\*/g, '[^/]*')
          .replace(/\?/g, '[^/]')
          .replace(/§/g, '.*')}(/.*)?$`,
      ),
  )
  return (file) => regexes.some((regex) => regex.test(file))
}

describe('Dockerfile', () => {
  const all = instructions(readFileSync('Dockerfile', 'utf8'))
  const built = stages(all)
  const final = built.at(-1)!
  const finalOf = (keyword: string) => final.body.filter((instruction) => instruction.keyword === keyword)

  it('is multi-stage on node:24-slim, installing production dependencies only', () => {
    expect(built.length).toBeGreaterThanOrEqual(2)
    for (const stage of built) expect(stage.from).toBe('node:24-slim')
    const installs = all.filter((instruction) => instruction.keyword === 'RUN' && /\bnpm (ci|install|i)\b/.test(instruction.args))
    expect(installs.length).toBeGreaterThan(0)
    for (const install of installs) expect(install.args).toMatch(/npm ci --omit=dev\b/)
    const depsStage = built.find((stage) => stage.body.some((instruction) => /npm ci --omit=dev/.test(instruction.args)))!
    expect(depsStage).not.toBe(final)
    expect(copies(final.body)).toContainEqual({ from: depsStage.name, sources: ['/app/node_modules'], target: './node_modules' })
    expect(finalOf('RUN'), 'the runtime stage installs nothing itself').toEqual([])
  })

  it('runs as a non-root user, with a HEALTHCHECK on /readyz and node (not npm) as the command', () => {
    const users = finalOf('USER')
    expect(users.length).toBeGreaterThan(0)
    expect(users.at(-1)!.args).not.toMatch(/^(root|0)(:|$)/)
    const [healthcheck] = finalOf('HEALTHCHECK')
    expect(healthcheck?.args).toMatch(/CMD/)
    // The URL comes from HEALTHCHECK_URL, whose default is the gateway's ops port.
    expect(healthcheck!.args).toContain('process.env.HEALTHCHECK_URL')
    const defaults = finalOf('ENV').map((instruction) => instruction.args).join(' ')
    expect(defaults).toContain(`HEALTHCHECK_URL=http://127.0.0.1:${gatewayFile.server.opsPort}/readyz`)
    const [cmd] = finalOf('CMD')
    expect(JSON.parse(cmd!.args)).toEqual(['node', '--import', 'tsx', GATEWAY_MAIN])
    expect(pkg.dependencies.tsx, 'tsx is a production dependency').toBeDefined()
  })

  it('COPYs every file the services and the operator CLIs need, and .dockerignore keeps none of them out', () => {
    const commands = [GATEWAY_MAIN, PETS_MAIN, ...Object.values(services).map(entryOf).filter((entry): entry is string => Boolean(entry))]
    const { files, packages } = importGraph([...new Set(commands), 'gateway/src/cli/keys.ts', 'gateway/src/cli/checkConfig.ts'])
    const readAtRunTime = ['package.json', 'config/gateway.yaml', ...['gateway/migrations', 'pets-service/migrations'].flatMap((directory) => readdirSync(directory).map((file) => `${directory}/${file}`))]
    const copied = copies(final.body)
      .filter((copy) => !copy.from)
      .flatMap((copy) => copy.sources)
      .map((source) => path.normalize(source))
    const ignored = dockerIgnored()
    const missing = [...files, ...readAtRunTime].filter((file) => !copied.some((source) => file === source || file.startsWith(`${source}/`)))
    expect(missing).toEqual([])
    expect([...files, ...readAtRunTime, ...copied, 'package-lock.json'].filter(ignored)).toEqual([])
    // Production dependencies only: whatever the code imports at run time must be one.
    expect([...packages].filter((name) => !(name in pkg.dependencies))).toEqual([])
    expect(files.size).toBeGreaterThan(20)
  })
})

describe('the healthcheck commands', () => {
  const dockerfile = instructions(readFileSync('Dockerfile', 'utf8'))
  const imageCheck = dockerfile.find((instruction) => instruction.keyword === 'HEALTHCHECK')!.args
  /** Each app healthcheck as the argv Docker runs, pointed at `port`, and the environment it gets. */
  const commands = (port: number) => [
    { name: 'Dockerfile', argv: JSON.parse(imageCheck.slice(imageCheck.indexOf('CMD') + 3)) as string[], env: { HEALTHCHECK_URL: `http://127.0.0.1:${port}/readyz` } },
    ...['gateway-1', 'pets-service'].map((name) => ({
      name,
      argv: (services[name]!.healthcheck!.test as string[]).slice(1).map((arg) => arg.replace(/127\.0\.0\.1:\d+/, `127.0.0.1:${port}`)),
      env: {},
    })),
  ]
  const exitCode = (argv: string[], env: Record<string, string>) =>
    promisify(execFile)(argv[0]!, argv.slice(1), { env: { ...process.env, ...env }, timeout: 3_000 }).then(
      () => 0,
      (error: { code?: number }) => error.code,
    )

  // They asked /readyz with fetch, which refuses the ports browsers block: a service whose ops
  // port was one of them (6666, 10080 …) was ready and answered 200, and Docker called it unhealthy.
  it('call a service healthy when its /readyz answers 200, and unhealthy otherwise, whatever its ops port (fetch refuses some)', async () => {
    const candidates = [6666, 6667, 6668, 6669, 10080, 6000]
    let port: number | undefined
    for (const candidate of candidates) if (!port && (await canListen(candidate))) port = candidate
    if (!port) return void console.warn(`${candidates.join(', ')} are all taken here: not checked`)
    let status = 200
    const server = createServer((_, response) => response.writeHead(status).end())
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve))
    try {
      for (const { name, argv, env } of commands(port)) {
        status = 200
        expect(await exitCode(argv, env), `${name}: ready`).toBe(0)
        status = 503
        expect(await exitCode(argv, env), `${name}: not ready`).toBe(1)
      }
    } finally {
      await new Promise((resolve) => server.close(resolve))
    }
    for (const { name, argv, env } of commands(port)) expect(await exitCode(argv, env), `${name}: nothing listening`).toBe(1)
  })
})
