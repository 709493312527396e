/**
 * `npm start`: the whole stack on one machine. Every service in SERVICES runs as a child
 * process; Postgres is `DATABASE_URL` or, when that is unset, PGlite embedded in this process (on
 * a worker thread of its own) and served over the Postgres wire protocol on a Unix socket, with
 * its files and the socket under DATA_DIR (default ./data), private to this user.
 *
 * Ctrl-C, SIGTERM or SIGHUP (a dev supervisor's terminal hung up), or the end of the process that
 * launched it (npm, which does not pass every signal on; see common/src/lifecycle/launcher.ts): SIGTERM to each
 * child, the gateway first (SIGKILL after 15 s), then the embedded database closes cleanly, then
 * exit 0. A child exiting on its own stops everything with exit 1. The children stop themselves
 * when this process dies without that chance (lib/exitWithParent.ts). To reload the gateway's
 * config, edit the file (it is watched) or send SIGHUP to the gateway's pid, printed when ready.
 */
import { X509Certificate, randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { statfs } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { inspect } from 'node:util'
import { socketPath, socketUrl } from '../common/src/database/embeddedPostgres.ts'
import { startEmbeddedPostgresInThread, type EmbeddedPostgresThread } from '../common/src/database/embeddedPostgresThread.ts'
import {
  databaseUrlFromEnv,
  drainMillisFromEnv,
  internalTokenFromEnv,
  listenersCollide,
  maxConnectionsFromEnv,
  ordersTokenFromEnv,
  poolSizeFromEnv,
  portFromEnv,
  previousInternalTokenFromEnv,
} from '../common/src/env.ts'
import { checkLogLevel } from '../common/src/logger.ts'
import { printableUrl } from '../common/src/database/printableUrl.ts'
import { DEFAULT_CONFIG_PATH, loadGatewayConfig } from '../gateway/src/config/loadConfig.ts'
import {
  SERVICES,
  describeListener,
  reachableUrl,
  resolveListener,
  spawnService,
  stopChild,
  waitUntilReady,
  type ResolvedListener,
  type RunningChild,
  type ServiceSpec,
} from './lib/childServices.ts'
import { DISCOVERY_FILE } from '../common/src/database/discoveryFile.ts'
import {
  PGLITE_FOLDER,
  assertPortsFree,
  claimDataDirectory,
  makeDatabaseFilesPrivate,
  ensureDatabaseCreated,
  makeDataDirectory,
  ownerRecord,
  releaseDataDirectory,
  removeTemporarySocketDirectory,
  removeUnusedDataDirectory,
  socketDirectoryFor,
  updateDiscoveryFile,
} from './lib/embeddedDatabase.ts'
import { issueDemoKeyOnFirstStart } from './lib/demoKey.ts'
import { watchLauncher } from '../common/src/lifecycle/launcher.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/** The number in the name of the embedded database's Unix socket (`.s.PGSQL.54329`); no TCP port is opened. */
const EMBEDDED_DEFAULT_PORT = 54329
const CHILD_STOP_GRACE_MILLIS = 15_000
const DATABASE_STOP_MILLIS = 10_000
const READY_TIMEOUT_MILLIS = 90_000

// A terminal that hung up (EIO) or a pipe whose reader is gone (EPIPE: `npm start | tee`, tee
// killed) fails every later write. Unheard, each failure was an uncaughtException whose own report
// failed again, a loop that kept the shutdown from ever running: lose the lines, not the stop.
for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined)

const say = (message: string) => console.log(`[start] ${message}`)
const warn = (message: string) => console.warn(`[start] warning: ${message}`)
const fail = (message: string) => console.error(`[start] error: ${message}`)

const children: RunningChild[] = []
let database: EmbeddedPostgresThread | undefined
let databaseStarting: Promise<EmbeddedPostgresThread> | undefined
let ownedDataDir: string | undefined
/** The data directory when this run made it, and the topmost folder made with it. */
let newDataDir: { dataDir: string; made: string } | undefined
/** The embedded database's URL when its socket lives in a temporary folder of this run's own. */
let temporarySocketUrl: string | undefined
let stopping: Promise<void> | undefined

/** Stops everything in order and exits; the first caller decides the exit code. */
function shutdown(exitCode: number): Promise<void> {
  stopping ??= (async () => {
    let code = exitCode
    // Reverse start order: the entry point (the gateway, once it is here) stops before what it calls.
    for (const child of [...children].reverse()) {
      if (child.hasExited()) continue
      const graceful = await stopChild(child, CHILD_STOP_GRACE_MILLIS)
      if (!graceful) {
        fail(`${child.spec.name} did not stop within ${CHILD_STOP_GRACE_MILLIS / 1000} s and was killed`)
        code = 1
      }
    }
    try {
      // A signal during PGlite's start: let it finish, then close it properly.
      const db = database ?? (await databaseStarting?.catch(() => undefined))
      if (db) await db.stop(DATABASE_STOP_MILLIS)
    } catch (error) {
      fail(`the embedded database did not close cleanly: ${(error as Error).message}`)
      code = 1
    }
    release()
    if (code === 0) say('stopped')
    process.exit(code)
  })()
  return stopping
}

/**
 * Gives the data directory back, removes this run's temporary socket folder, and the data
 * directory itself when this run made it and created no database in it. Synchronous, for the exit handler too.
 */
function release(): void {
  if (ownedDataDir) releaseDataDirectory(ownedDataDir)
  if (temporarySocketUrl) removeTemporarySocketDirectory(temporarySocketUrl)
  if (newDataDir) removeUnusedDataDirectory(newDataDir.dataDir, newDataDir.made)
}

function onSignal(signal: NodeJS.Signals): void {
  if (stopping) {
    warn(`${signal} again: killing everything now`)
    for (const child of children) if (!child.hasExited()) child.process.kill('SIGKILL')
    release()
    process.exit(1)
  }
  say(`${signal}: stopping`)
  void shutdown(0)
}

process.on('SIGINT', onSignal)
process.on('SIGTERM', onSignal)
process.on('SIGHUP', onSignal)
// `kill <pid of npm start>` ends npm (and sh) but reaches neither tsx nor this process: same stop.
watchLauncher((launcher) => {
  if (stopping) return
  say(`${launcher} exited: stopping`)
  void shutdown(0)
})
process.on('exit', () => {
  // Last resort on any exit path: no child outlives us, and the data directory is released.
  for (const child of children) if (!child.hasExited()) child.process.kill('SIGKILL')
  release()
})
for (const event of ['uncaughtException', 'unhandledRejection'] as const) {
  process.on(event, (error: unknown) => {
    fail(`${event}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`)
    void shutdown(1)
  })
}

interface PlannedService {
  spec: ServiceSpec
  api: ResolvedListener
  ops: ResolvedListener
}

async function assertServicePortsFree(planned: PlannedService[]): Promise<void> {
  await assertPortsFree(
    planned.flatMap(({ spec, api, ops }) => [
      { host: api.host, port: api.port, what: spec.name, variable: spec.api.portVariable },
      { host: ops.host, port: ops.port, what: `${spec.name}'s ops port`, variable: spec.ops.portVariable },
    ]),
  )
}

/** The variables a service checks at its start besides the gateway config's; each wrong one throws, naming it. */
function checkServiceVariables(env: NodeJS.ProcessEnv): void {
  checkLogLevel(env)
  drainMillisFromEnv(env)
  if (env.DATABASE_URL) databaseUrlFromEnv(env)
  // Generated when unset; one given must be one both services take.
  if (env.INTERNAL_TOKEN) internalTokenFromEnv(env)
  previousInternalTokenFromEnv(env)
  maxConnectionsFromEnv('PETS_MAX_CONNECTIONS', undefined, env)
}

/**
 * Two of the stack's own listeners on one port (GATEWAY_PORT=3001 beside the pets-service's
 * default, say): each is free now, but the second service to start would die on EADDRINUSE, after
 * the database was created. Said before anything starts, naming the variables that move them.
 */
function assertOwnListenersApart(planned: PlannedService[]): void {
  const listeners = planned.flatMap(({ spec, api, ops }) => [
    { ...api, variable: spec.api.portVariable },
    { ...ops, variable: spec.ops.portVariable },
  ])
  for (const [index, first] of listeners.entries()) {
    const second = listeners.slice(index + 1).find((other) => listenersCollide(first, other))
    if (second) {
      throw new Error(
        `${first.variable} and ${second.variable} are both ${first.port} on one address (${first.host} and ${second.host}): ` +
          'set one of them to another port',
      )
    }
  }
}

/**
 * Client connections the embedded server takes: both services' pools (DATABASE_POOL_SIZE each),
 * the gateway's LISTEN connection, the keys CLI's two and the demo key's one, with room to spare.
 * PGlite is one backend however many there are; a connection past the cap would be refused.
 */
function embeddedConnectionCap(poolSize: number): number {
  return Math.max(32, 2 * poolSize + 8)
}

async function startDatabase(dataDir: string, socketDirectory: string, port: number, poolSize: number): Promise<EmbeddedPostgresThread> {
  const pgliteDir = path.join(dataDir, PGLITE_FOLDER)
  await ensureDatabaseCreated(pgliteDir, say)
  databaseStarting = startEmbeddedPostgresInThread({
    dataDir: pgliteDir,
    socketDirectory,
    port,
    maxConnections: embeddedConnectionCap(poolSize),
    onFailure: (message) => {
      const full = message.includes('No space left on device')
      fail(`the embedded database stopped: ${message}${full ? `. ${FREE_SPACE_ADVICE}` : ''}; stopping everything`)
      void shutdown(1)
    },
  })
  try {
    database = await databaseStarting
  } catch (error) {
    const free = await freeBytes(pgliteDir)
    if (free !== undefined && free < ROOM_TO_OPEN_BYTES) {
      throw new Error(
        `cannot open the embedded database in ${pgliteDir}: ${messageOf(error)}; the disk holding it has ` +
          `${(free / 2 ** 20).toFixed(1)} MB free. ${FREE_SPACE_ADVICE}`,
        { cause: error },
      )
    }
    // PGlite's own words for damaged files ("Aborted()", "failed to initialize") name no folder.
    throw new Error(
      `cannot open the embedded database in ${pgliteDir}: ${messageOf(error)} (if its files are damaged, move the folder aside to start ` +
        'afresh, or set DATA_DIR to use another folder)',
      { cause: error },
    )
  }
  if (!stopping) await updateDiscoveryFile(dataDir, ownerRecord(database.url))
  return database
}

/**
 * PGlite writes its write-ahead log in 16 MB files and needs a new one to open a database that
 * was not closed cleanly (the recovery's end) or whose log is full; below this it fails to open
 * with no word of why.
 */
const ROOM_TO_OPEN_BYTES = 32 * 2 ** 20
const FREE_SPACE_ADVICE =
  'Free some space on that disk (PGlite needs at least 32 MB to open the database) and run npm start again: ' +
  'it recovers everything committed before, as Postgres does after a crash'

async function freeBytes(folder: string): Promise<number | undefined> {
  try {
    const { bavail, bsize } = await statfs(folder)
    return bavail * bsize
  } catch {
    return undefined
  }
}

/** What listens where, once every service answers /readyz. */
function printReady(planned: PlannedService[], postgres: string): void {
  const width = Math.max('Postgres'.length, ...planned.map(({ spec }) => spec.name.length))
  say('ready:')
  for (const [index, { spec, api, ops }] of planned.entries()) {
    const opsUrl = `${describeListener(ops)} (/healthz /readyz /metrics)`
    const pid = children[index]?.process.pid
    console.log(`[start]   ${spec.name.padEnd(width)}  ${describeListener(api)} (${spec.api.note}), ops ${opsUrl}, pid ${pid}`)
  }
  console.log(`[start]   ${'Postgres'.padEnd(width)}  ${postgres}`)
  const gateway = planned.findIndex(({ spec }) => spec.name === 'gateway')
  if (gateway >= 0) {
    const configPath = process.env.GATEWAY_CONFIG || DEFAULT_CONFIG_PATH
    say(`the gateway reloads ${configPath} when it changes, or on: kill -HUP ${children[gateway]?.process.pid}`)
  }
  say('Ctrl-C stops everything, as does SIGTERM or SIGHUP to npm start')
}

async function main(): Promise<void> {
  const env = process.env
  const planned: PlannedService[] = SERVICES.map((spec) => ({
    spec,
    api: resolveListener(spec.api, env),
    ops: resolveListener(spec.ops, env),
  }))
  for (const { spec, ops } of planned) {
    if (ops.port === 0) {
      throw new Error(`${spec.ops.portVariable}=0 is not supported by npm start: it must know where to ask /readyz`)
    }
  }
  assertOwnListenersApart(planned)
  // A config the gateway would refuse stops everything now, not after a database and a
  // pets-service were started for a gateway that then exits.
  const gatewayConfig = loadGatewayConfig(undefined, env)
  if (gatewayConfig.upstreams.orders) ordersTokenFromEnv(env)
  // So does what the pets-service, or both services, would refuse (the gateway's own variables
  // are checked with its config above): not after the embedded database was created.
  checkServiceVariables(env)
  const gatewayApi = planned.find(({ spec }) => spec.name === 'gateway')?.api
  if (gatewayApi && gatewayConfig.server.tls) {
    gatewayApi.tls = true
    tlsCertFile = gatewayConfig.server.tls.certFile
  }

  let databaseUrl = env.DATABASE_URL
  let embedded: { port: number; socketDirectory: string; poolSize: number } | undefined
  const dataDir = path.resolve(env.DATA_DIR || 'data')
  if (!databaseUrl) {
    const port = portFromEnv('EMBEDDED_POSTGRES_PORT', EMBEDDED_DEFAULT_PORT, env, {
      why: 'it names the socket file .s.PGSQL.<port>, so there is no free port to pick',
    })
    const poolSize = poolSizeFromEnv(env)
    // The folders PGlite makes private to this user (its files: makeDatabaseFilesPrivate).
    process.umask(0o077)
    const made = await makeDataDirectory(dataDir)
    if (made) newDataDir = { dataDir, made }
    warn(
      'DATABASE_URL is not set: Postgres is PGlite embedded in this process ' +
        `(data in ${path.join(dataDir, PGLITE_FOLDER)}). This is the single-process default for one machine; ` +
        'set DATABASE_URL to use a real Postgres.',
    )
    // A Unix socket in a private folder, not a TCP port: the server takes any user and password,
    // so the folder's permissions are what keep other users of the machine out.
    const socketDirectory = await socketDirectoryFor(dataDir, port)
    const url = socketUrl(socketDirectory, port)
    if (socketDirectory !== dataDir) temporarySocketUrl = url
    await claimDataDirectory(dataDir, ownerRecord(url), {
      onStale: (previous) => {
        say(
          `${path.join(dataDir, DISCOVERY_FILE)} was left by a run that did not stop cleanly` +
            `${previous ? ` (pid ${previous.pid})` : ''}; recovering`,
        )
        if (previous) removeTemporarySocketDirectory(previous.url)
      },
    })
    ownedDataDir = dataDir
    embedded = { port, socketDirectory, poolSize }
  }
  // Fail in a second with a clear message rather than after PGlite's start with a child's stack trace.
  await assertServicePortsFree(planned)

  let internalToken = env.INTERNAL_TOKEN
  if (!internalToken) {
    internalToken = randomBytes(32).toString('base64url')
    say('INTERNAL_TOKEN is not set: generated a random one for this run (set it to call the pets-service directly)')
  }

  if (embedded) {
    databaseUrl = (await startDatabase(dataDir, embedded.socketDirectory, embedded.port, embedded.poolSize)).url
    await makeDatabaseFilesPrivate(path.join(dataDir, PGLITE_FOLDER))
  }
  if (stopping || !databaseUrl) return
  // Again, now that seconds have passed: /readyz must not be answered by someone else's process.
  await assertServicePortsFree(planned)

  // No load balancer routes to a development stack: Ctrl-C stops it without the drain, unless asked for.
  const childEnv: NodeJS.ProcessEnv = {
    SHUTDOWN_DRAIN_SECONDS: '0',
    ...env,
    DATABASE_URL: databaseUrl,
    INTERNAL_TOKEN: internalToken,
  }
  // npm start runs both ends, so the gateway's upstream follows wherever the pets-service listens.
  const pets = planned.find(({ spec }) => spec.name === 'pets-service')
  if (pets && !env.PETS_URL) childEnv.PETS_URL = reachableUrl(pets.api)
  for (const { spec } of planned) {
    const child = spawnService(spec, ROOT, childEnv)
    children.push(child)
    void child.exited.then(({ code, signal }) => {
      if (stopping) return
      const how = signal ? `signal ${signal}` : `exit code ${code}`
      fail(`${spec.name} exited unexpectedly (${how}); stopping everything`)
      void shutdown(1)
    })
  }
  try {
    await Promise.all(
      planned.map(({ ops }, index) =>
        waitUntilReady(children[index]!, `${reachableUrl(ops)}/readyz`, READY_TIMEOUT_MILLIS),
      ),
    )
  } catch (error) {
    if (stopping) return
    throw error
  }
  if (stopping) return

  const where = embedded
    ? `embedded PGlite, data in ${path.join(dataDir, PGLITE_FOLDER)}, socket ${socketPath(embedded.socketDirectory, embedded.port)}` +
      `; psql -h ${shellQuoted(embedded.socketDirectory)} -p ${embedded.port} -U postgres`
    : 'DATABASE_URL'
  printReady(planned, `${printableUrl(databaseUrl)} (${where})`)
  if (embedded) await printDemoKey(databaseUrl, planned)
  // No demo key on a real database (DESIGN): how to make one, since every /v1 call needs one.
  else if (planned.some(({ spec }) => spec.name === 'gateway')) say(`keys: ${keysCommand(['GATEWAY_CONFIG'])} create --plan free --name my-app   (with this DATABASE_URL; the name says who the key is for)`)
}

/**
 * The keys CLI as this start's gateway sees things: it finds the embedded database through
 * DATA_DIR and reads the plans from GATEWAY_CONFIG, so a shell without them would look in ./data
 * and refuse a plan only this config names.
 */
function keysCommand(names: readonly ('DATA_DIR' | 'GATEWAY_CONFIG')[] = ['DATA_DIR', 'GATEWAY_CONFIG']): string {
  const settings = names.flatMap((name) => (process.env[name] ? [`${name}=${shellQuoted(process.env[name])}`] : []))
  return [...settings, 'npm run keys --'].join(' ')
}

async function printDemoKey(databaseUrl: string, planned: PlannedService[]): Promise<void> {
  const gateway = planned.find(({ spec }) => spec.name === 'gateway')
  // A service that died after the ready banner stops everything: no key for a stack going down,
  // nor lines about one printed after the error.
  if (!gateway || stopping) return
  const key = await issueDemoKeyOnFirstStart(databaseUrl)
  if (!key) {
    if (stopping) return
    const keys = keysCommand()
    say(`more keys: ${keys} create --plan free --name my-app   (list them: ${keys} list)`)
    return
  }
  // Issued before the stop began: shown all the same, as no later start issues another.
  if (stopping) {
    say(`the demo key issued as the stack stopped (shown this once; keep it): ${key}`)
    return
  }
  say('first start: issued a Free-plan demo key. It is shown this once; keep it:')
  console.log(`\n    ${key}\n`)
  say('try it:')
  console.log(`\n    curl -i ${curlTrust()}-H "Authorization: Bearer ${key}" ${reachableUrl(gateway.api)}/v1/pets\n`)
  if (tlsCertFile && !selfSigned(tlsCertFile)) {
    say("the gateway serves HTTPS: curl trusts its certificate if a CA curl knows signed it; for a private CA add --cacert <the CA's file> (-k skips the check)")
  }
}

/** The gateway's certificate file when it serves HTTPS (server.tls), for the curl line. */
let tlsCertFile: string | undefined

function selfSigned(certFile: string): boolean {
  try {
    const certificate = new X509Certificate(readFileSync(certFile))
    return certificate.issuer === certificate.subject
  } catch {
    return false
  }
}

/** A self-signed certificate is its own CA: curl is told to trust it (it must name 127.0.0.1, or use -k). */
function curlTrust(): string {
  return tlsCertFile && selfSigned(tlsCertFile) ? `--cacert ${shellQuoted(tlsCertFile)} ` : ''
}

/** What failed, in words: not every failure is an Error (PGlite rejects with plain objects), never "[object Object]". */
function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : inspect(error, { depth: 3, breakLength: Infinity })
}

/** A value as one POSIX shell word. */
function shellQuoted(value: string): string {
  return /^[\w./:-]+$/.test(value) ? value : `'${value.replaceAll("'", "'\\''")}'`
}

main().catch((error: unknown) => {
  if (stopping) return
  fail(messageOf(error))
  void shutdown(1)
})
