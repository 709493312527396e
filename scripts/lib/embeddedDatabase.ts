import { type Dirent, lstatSync, readFileSync, rmdirSync, rmSync } from 'node:fs'
import { access, chmod, link, lstat, mkdir, mkdtemp, readdir, readFile, rename, rm, rmdir, stat, writeFile } from 'node:fs/promises'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { PGlite } from '@electric-sql/pglite'
import { SOCKET_PATH_MAX_BYTES, socketPath } from '../../common/src/database/embeddedPostgres.ts'
import {
  DISCOVERY_FILE,
  processIdentity,
  processIsAlive,
  type EmbeddedDatabaseRecord,
} from '../../common/src/database/discoveryFile.ts'

/**
 * The embedded database's files under the data directory (`DATA_DIR`, default `./data`):
 *
 *   pglite/                   PGlite's Postgres data directory
 *   embedded-postgres.json    `{ url, pid, started }` while an `npm start` owns the data directory, so
 *                             other commands (the keys CLI) can find the running database
 *   .s.PGSQL.<port>           the Unix socket it is served on (EMBEDDED_POSTGRES_PORT), unless the
 *                             path would be too long for one (socketDirectoryFor)
 */
export const PGLITE_FOLDER = 'pglite'

/** This process as the owner of a data directory whose database answers at `url`. */
export function ownerRecord(url: string): EmbeddedDatabaseRecord {
  const started = processIdentity(process.pid)
  return { url, pid: process.pid, ...(started === undefined ? {} : { started }) }
}

export function discoveryFilePath(dataDir: string): string {
  return path.join(dataDir, DISCOVERY_FILE)
}

/**
 * Makes the data directory and any missing parent, private to this user. Returns the topmost
 * folder it made (removeUnusedDataDirectory's bound), undefined when the data directory existed.
 * An existing folder that is not npm start's (refusalOf) is refused before anything is written to
 * it or its mode is changed: DATA_DIR set to a home folder, a project or `/` would otherwise be
 * made 0700 and get the database's files among its own.
 */
export async function makeDataDirectory(dataDir: string): Promise<string | undefined> {
  const refusal = await refusalOf(dataDir)
  if (refusal) throw new Error(`DATA_DIR ${dataDir} ${refusal}; npm start left it untouched: set DATA_DIR to an empty or new folder`)
  try {
    return await mkdir(dataDir, { recursive: true, mode: 0o700 })
  } catch (error) {
    throw new Error(`cannot make DATA_DIR ${dataDir}: ${await whyNotMade(dataDir, error)}; set DATA_DIR to a folder npm start can write`, { cause: error })
  }
}

/** What a system error code says of a folder npm start could not write. */
const WRITE_REFUSALS: Record<string, string> = {
  EROFS: 'read-only file system',
  EACCES: 'permission denied',
  EPERM: 'not permitted',
  ENOSPC: 'no space left on the disk',
  EDQUOT: 'the disk quota is used up',
  ENOTDIR: 'a part of its path is a file',
}

/** The words for a write refused in the data directory, or undefined for another failure. */
function writeRefusal(error: unknown): string | undefined {
  const code = (error as NodeJS.ErrnoException).code
  return code === undefined || WRITE_REFUSALS[code] === undefined ? undefined : `${WRITE_REFUSALS[code]} (${code})`
}

/**
 * Why a recursive mkdir failed. Node reports ENOENT for a folder it could not make under a
 * read-only parent, which says nothing: the first missing level is made alone to learn the cause.
 */
async function whyNotMade(dataDir: string, error: unknown): Promise<string> {
  if ((error as NodeJS.ErrnoException).code === 'ENOENT') {
    let missing = dataDir
    while (path.dirname(missing) !== missing && !(await exists(path.dirname(missing)))) missing = path.dirname(missing)
    try {
      await mkdir(missing, { mode: 0o700 })
      await rmdir(missing)
    } catch (cause) {
      return writeRefusal(cause) ?? (cause as Error).message
    }
  }
  return writeRefusal(error) ?? (error as Error).message
}

/**
 * What npm start itself writes in a data directory: the database, its staging folder and a partial
 * one set aside (ensureDatabaseCreated), the discovery file and its copies being written
 * (createWhole, updateDiscoveryFile), the socket and canHoldSocket's probe.
 */
const OWN_ENTRIES = [
  /^pglite$/,
  /^pglite\.creating$/,
  /^pglite\.incomplete-/,
  /^embedded-postgres\.json(\.\d+\.(claim|tmp))?$/,
  /^\.s\.PGSQL\.\d+$/,
  /^\.s\.p\d+$/,
  // Not npm start's, but all a new ext4 file system holds: a disk mounted for the data is empty.
  /^lost\+found$/,
]

/**
 * Why npm start must not use `dataDir`, or undefined when it may: a folder that does not exist yet,
 * is empty, holds its database (pglite/PG_VERSION, the layout of every version so far, whatever the
 * user put beside it), or holds only what npm start writes (a first start interrupted before its
 * database existed, or another start on it right now, which the claim then reports).
 */
async function refusalOf(dataDir: string): Promise<string | undefined> {
  let entries: string[]
  try {
    entries = await readdir(dataDir)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOTDIR') return 'is not a folder'
    // ENOENT: a new folder. Anything else (EACCES) is reported by the steps that use the folder.
    return undefined
  }
  if (entries.every((entry) => OWN_ENTRIES.some((own) => own.test(entry)))) return undefined
  if (await exists(path.join(dataDir, PGLITE_FOLDER, 'PG_VERSION'))) return undefined
  return `holds other files and no embedded database of npm start (no ${PGLITE_FOLDER}/PG_VERSION)`
}

/**
 * Removes the folders makeDataDirectory made, from the data directory up to `made`, each only if
 * it is empty: a first start refused before its database was created (a port taken) leaves no
 * empty data folder for the user to wonder about. Synchronous so it also works in an exit handler.
 */
export function removeUnusedDataDirectory(dataDir: string, made: string): void {
  const below = path.relative(made, dataDir)
  if (below.startsWith('..') || path.isAbsolute(below)) return
  for (let folder = dataDir; ; folder = path.dirname(folder)) {
    try {
      rmdirSync(folder)
    } catch {
      // Not empty (the database, a claim of another start) or gone already: kept, and its parents too.
      return
    }
    if (folder === made) return
  }
}

/** Where a temporary socket directory is made when the data directory cannot hold the socket. */
const TEMPORARY_SOCKET_PREFIX = 'aas-postgres-'

/**
 * The directory for the embedded database's Unix socket: the data directory itself, private to
 * this user (0700; made so here), where `psql -h <DATA_DIR> -p <port>` finds it. When the socket's
 * path there would be longer than a socket path can be (SOCKET_PATH_MAX_BYTES), or the folder
 * cannot be made private (another user's), or cannot hold a socket at all (a Windows drive under
 * WSL, some container bind mounts), a new private folder under the system's temporary directory
 * instead: the discovery file names it, and the run removes it when it stops
 * (removeTemporarySocketDirectory).
 */
export async function socketDirectoryFor(dataDir: string, port: number): Promise<string> {
  await mkdir(dataDir, { recursive: true, mode: 0o700 })
  await chmod(dataDir, 0o700).catch(() => undefined)
  const { mode, uid } = await stat(dataDir)
  const mine = process.getuid === undefined || uid === process.getuid()
  const fits = Buffer.byteLength(socketPath(dataDir, port)) <= SOCKET_PATH_MAX_BYTES
  if (mine && (mode & 0o077) === 0 && fits && (await canHoldSocket(dataDir))) return dataDir
  const directory = await mkdtemp(path.join(temporaryRoot(), TEMPORARY_SOCKET_PREFIX))
  if (Buffer.byteLength(socketPath(directory, port)) > SOCKET_PATH_MAX_BYTES) {
    await rm(directory, { recursive: true, force: true })
    throw new Error(
      `the embedded Postgres's socket path is too long for the system both in ${dataDir} and in ${temporaryRoot()}; ` +
        'set DATA_DIR (or TMPDIR) to a shorter path',
    )
  }
  return directory
}

/**
 * Whether a Unix socket can be made in `directory`: bound once under a name no longer than the
 * server's (so a run on this folder is not disturbed), then removed.
 */
function canHoldSocket(directory: string): Promise<boolean> {
  const probe = path.join(directory, `.s.p${process.pid}`)
  return new Promise((resolve) => {
    const server = net.createServer()
    server.once('error', () => resolve(false))
    // Closing a listening Unix socket server removes its file.
    server.listen(probe, () => server.close(() => resolve(true)))
  })
}

/**
 * The system's temporary directory as an absolute path: in the URL, a socket folder from a
 * relative TMPDIR is a host name to pg (ENOTFOUND: the services wait for Postgres for ever).
 */
function temporaryRoot(): string {
  return path.resolve(os.tmpdir())
}

/**
 * Removes a socket directory socketDirectoryFor made under the temporary directory: the one of
 * this run, or of a run that did not stop cleanly (from its discovery file's URL). Only what it
 * made goes: the socket file and then the folder if that left it empty. A folder that only looks
 * like one (a data directory named `aas-postgres-…` under the temporary directory, whose record
 * names it as its socket folder) keeps everything else in it. Synchronous so it also works in an exit handler.
 */
export function removeTemporarySocketDirectory(url: string): void {
  const address = socketAddress(url)
  if (address === undefined) return
  const { directory, file } = address
  if (path.dirname(directory) !== temporaryRoot() || !path.basename(directory).startsWith(TEMPORARY_SOCKET_PREFIX)) return
  try {
    if (lstatSync(file).isSocket()) rmSync(file, { force: true })
  } catch {
    // No socket: the run stopped cleanly, and the server removed it.
  }
  try {
    rmdirSync(directory)
  } catch {
    // Gone already, or not empty: not a folder of socketDirectoryFor's alone.
  }
}

/** The socket directory and its socket file named by a socket-form URL (socketUrl); undefined for a TCP URL. */
function socketAddress(url: string): { directory: string; file: string } | undefined {
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    return undefined
  }
  const directory = parsed.searchParams.get('host')
  if (parsed.hostname !== '' || !directory?.startsWith('/')) return undefined
  return { directory, file: socketPath(directory, Number(parsed.searchParams.get('port') || 5432)) }
}

/** The record in the discovery file, or undefined when there is none or it is unreadable. */
export async function readDiscoveryFile(dataDir: string): Promise<EmbeddedDatabaseRecord | undefined> {
  let text: string
  try {
    text = await readFile(discoveryFilePath(dataDir), 'utf8')
  } catch {
    return undefined
  }
  try {
    const parsed = JSON.parse(text) as Partial<EmbeddedDatabaseRecord>
    if (typeof parsed.url === 'string' && Number.isInteger(parsed.pid) && (parsed.pid ?? 0) > 0) {
      return { url: parsed.url, pid: parsed.pid as number, ...(typeof parsed.started === 'string' ? { started: parsed.started } : {}) }
    }
  } catch {
    // A file cut short by a crash while it was written: treated like no file.
  }
  return undefined
}

/**
 * True when something accepts connections where the URL points: its Unix socket, or its host and
 * port (the TCP URL of a discovery file an older version wrote).
 */
export function answers(url: string, timeoutMillis = 1_000): Promise<boolean> {
  const unix = socketAddress(url)
  return new Promise((resolve) => {
    let socket: net.Socket
    if (unix) {
      socket = net.connect({ path: unix.file })
    } else {
      const { hostname, port } = new URL(url)
      socket = net.connect({ host: hostname, port: Number(port || 5432) })
    }
    const done = (result: boolean) => {
      socket.destroy()
      resolve(result)
    }
    socket.setTimeout(timeoutMillis, () => done(false))
    socket.once('connect', () => done(true))
    socket.once('error', () => done(false))
  })
}

export class DataDirectoryInUseError extends Error {}

type ClaimOptions = { onStale?: (previous: EmbeddedDatabaseRecord | undefined) => void; startingGraceMillis?: number }

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/**
 * Makes this process the owner of `dataDir` by creating the discovery file exclusively. PGlite
 * is one process's database: two processes on the same files would corrupt them. A file left
 * by a run that did not stop cleanly (crash, SIGKILL, power loss) is recognised as stale and
 * replaced; `onStale` is told so the user learns about it.
 */
export async function claimDataDirectory(
  dataDir: string,
  record: EmbeddedDatabaseRecord,
  options: ClaimOptions = {},
): Promise<void> {
  try {
    await claim(dataDir, record, options)
  } catch (error) {
    const refusal = writeRefusal(error)
    if (refusal === undefined) throw error
    throw new Error(`cannot write in DATA_DIR ${dataDir}: ${refusal}; set DATA_DIR to a folder npm start can write`, { cause: error })
  }
}

async function claim(
  dataDir: string,
  record: EmbeddedDatabaseRecord,
  options: ClaimOptions,
): Promise<void> {
  // Private to this user: the database files and the discovery file are keys. An existing folder
  // is made private too, not only one created here.
  await mkdir(dataDir, { recursive: true, mode: 0o700 })
  await chmod(dataDir, 0o700).catch(() => undefined)
  await refuseAnotherUsersFolder(dataDir)
  await makeDatabaseFilesPrivate(path.join(dataDir, PGLITE_FOLDER))
  const file = discoveryFilePath(dataDir)
  for (let attempt = 0; attempt < 3; attempt += 1) {
    if (await createWhole(file, JSON.stringify(record))) return
    const previous = await readDiscoveryFile(dataDir)
    const now = previous && previous.started !== undefined ? processIdentity(previous.pid) : undefined
    if (previous && previous.pid !== record.pid && now !== undefined && now === previous.started) {
      // The very process that claimed the folder, serving or not: one still starting, or stopped
      // (Ctrl-Z, a suspended machine) for however long. Taking its files over would let two
      // processes write one database.
      if (await answers(previous.url)) throw alreadyServing(previous, dataDir)
      throw new DataDirectoryInUseError(
        `another npm start (pid ${previous.pid}) owns ${dataDir} and is still starting, or is stopped (Ctrl-Z); ` +
          'let it finish or stop it first, or set DATA_DIR to use another folder',
      )
    }
    if (previous && previous.pid !== record.pid && now === undefined && processIsAlive(previous.pid)) {
      // Where the process cannot be told apart from a later one with its pid (no /proc, or a file
      // from an older version): alive and serving is certainly a running `npm start`; alive but
      // not (yet) serving is either one still starting (PGlite takes seconds) or an unrelated
      // process that reused the pid after a reboot, and waiting a little tells the two apart.
      const deadline = Date.now() + (options.startingGraceMillis ?? 15_000)
      for (;;) {
        if (await answers(previous.url)) throw alreadyServing(previous, dataDir)
        if (Date.now() > deadline || !processIsAlive(previous.pid)) break
        await sleep(250)
      }
    }
    options.onStale?.(previous)
    await rm(file, { force: true })
    // The stale run's half-done rewrite of the file (updateDiscoveryFile), if it was killed mid-way.
    if (previous) await rm(`${file}.${previous.pid}.tmp`, { force: true })
  }
  throw new DataDirectoryInUseError(`could not take ownership of ${dataDir}: ${file} keeps coming back`)
}

/**
 * A DATA_DIR that belongs to another user is refused: its owner can read and change the database
 * in it (every key's hash, the catalogue), or have put one there whose keys it knows, and can make
 * it readable to all again whatever mode it is given. It was used without a word (only the socket
 * moved to a private folder). Root may use any folder: a container's bind mount is often another
 * uid's, and no user can keep root out anyway.
 */
async function refuseAnotherUsersFolder(dataDir: string): Promise<void> {
  const me = process.getuid?.()
  if (me === undefined || me === 0) return
  const { uid } = await stat(dataDir)
  if (uid === me) return
  throw new Error(
    `DATA_DIR ${dataDir} belongs to another user (uid ${uid}), who could read and change the embedded database in it; ` +
      'set DATA_DIR to a folder of your own',
  )
}

/**
 * PGlite writes its files 0666 (the catalogs, the WAL) whatever the process's umask, the folder's
 * 0700 their only cover: gone once the folder is copied with its modes (`rsync -a`, `tar -p`) or
 * loosened. Made private when the folder is claimed and again once the database is up (the files
 * a first start writes); npm start's umask keeps the folders PGlite makes private.
 */
export async function makeDatabaseFilesPrivate(pgliteDir: string): Promise<void> {
  let entries: Dirent[]
  try {
    entries = await readdir(pgliteDir, { withFileTypes: true })
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return
    throw error
  }
  const { mode } = await lstat(pgliteDir)
  if ((mode & 0o077) !== 0) await chmod(pgliteDir, mode & 0o700)
  // Never through a symbolic link (a pg_wal moved to another disk by hand): what it names is not
  // this folder's to change, and a link to a folder above would be walked for ever.
  for (const entry of entries) {
    const entryPath = path.join(pgliteDir, entry.name)
    if (entry.isDirectory()) await makeDatabaseFilesPrivate(entryPath)
    else if (entry.isFile()) {
      const file = await lstat(entryPath)
      if ((file.mode & 0o077) !== 0) await chmod(entryPath, file.mode & 0o700)
    }
  }
}

/**
 * Creates `file` with `text` unless it exists, in one step: written beside it, then linked under
 * its name. A file created and then written (`wx`) is empty for a moment, and another start
 * reading it then would take the claim for a stale one and take the folder over.
 */
async function createWhole(file: string, text: string): Promise<boolean> {
  const temporary = `${file}.${process.pid}.claim`
  await writeFile(temporary, text, { mode: 0o600 })
  try {
    await link(temporary, file)
    return true
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error
    return false
  } finally {
    await rm(temporary, { force: true })
  }
}

function alreadyServing(owner: EmbeddedDatabaseRecord, dataDir: string): DataDirectoryInUseError {
  return new DataDirectoryInUseError(
    `another npm start (pid ${owner.pid}) is already running on ${dataDir} and serves Postgres at ${owner.url}; ` +
      'stop it first, or set DATA_DIR to use another folder',
  )
}

/** Rewrites the discovery file in place (write then rename, so readers never see half a file). */
export async function updateDiscoveryFile(dataDir: string, record: EmbeddedDatabaseRecord): Promise<void> {
  const file = discoveryFilePath(dataDir)
  const temporary = `${file}.${record.pid}.tmp`
  await writeFile(temporary, JSON.stringify(record), { mode: 0o600 })
  await rename(temporary, file)
}

/** Removes the discovery file if this process owns it. Synchronous so it also works in an exit handler. */
export function releaseDataDirectory(dataDir: string, pid = process.pid): void {
  const file = discoveryFilePath(dataDir)
  try {
    const parsed = JSON.parse(readFileSync(file, 'utf8')) as Partial<EmbeddedDatabaseRecord>
    if (parsed.pid !== pid) return
  } catch {
    return
  }
  rmSync(file, { force: true })
}

async function exists(file: string): Promise<boolean> {
  try {
    await access(file)
    return true
  } catch {
    return false
  }
}

/**
 * Creates the PGlite data directory on the first start, crash-safely. PGlite runs initdb in
 * memory and then copies the files out; a process killed during that copy leaves a partial
 * folder that a later start could take for a database. So the new database is created in a
 * staging folder, closed cleanly and only then renamed into place (a rename is atomic).
 * A folder without PG_VERSION left by older runs is moved aside rather than deleted.
 */
export async function ensureDatabaseCreated(
  pgliteDir: string,
  onNote: (message: string) => void = () => undefined,
): Promise<'existing' | 'created'> {
  if (await exists(path.join(pgliteDir, 'PG_VERSION'))) return 'existing'
  const staging = `${pgliteDir}.creating`
  await rm(staging, { recursive: true, force: true })
  await mkdir(staging, { recursive: true })
  onNote(`creating the embedded database in ${pgliteDir} (first start, takes a few seconds)`)
  const db = await PGlite.create({ dataDir: staging })
  await db.close()
  if (await exists(pgliteDir)) {
    if ((await readdir(pgliteDir)).length > 0) {
      const aside = `${pgliteDir}.incomplete-${new Date().toISOString().replaceAll(':', '-')}`
      await rename(pgliteDir, aside)
      onNote(`${pgliteDir} held no complete database; moved it to ${aside}`)
    } else {
      await rm(pgliteDir, { recursive: true, force: true })
    }
  }
  await rename(staging, pgliteDir)
  return 'created'
}

/** A listener npm start is about to open: where, what for, and the variable that moves it. */
export interface PlannedListener {
  host: string
  port: number
  what: string
  variable: string
}

/**
 * Fails with a clear message when a listener's host:port is taken, naming the variable that moves
 * it. Every taken one at once: where another stack runs, all four defaults are, and naming one per
 * attempt took four starts to learn that. Checked in turn, so two listeners given one port are not
 * mistaken for each other's occupant (the service itself says that one).
 */
export async function assertPortsFree(listeners: PlannedListener[]): Promise<void> {
  const taken: PlannedListener[] = []
  for (const listener of listeners) if (await portTaken(listener)) taken.push(listener)
  if (taken.length === 0) return
  const where = taken.map(({ host, port, what }) => `${host}:${port} (${what})`)
  const variables = taken.map(({ variable }) => variable)
  throw new Error(
    taken.length === 1
      ? `${taken[0]!.host}:${taken[0]!.port} is already in use, so ${taken[0]!.what} cannot listen there. ` +
          `Is another npm start running? Otherwise set ${variables[0]} to a free port.`
      : `${where.join(', ')} are already in use. Is another npm start running? ` +
          `Otherwise set ${variables.join(', ')} to free ports.`,
  )
}

function portTaken({ host, port, what }: PlannedListener): Promise<boolean> {
  if (port === 0) return Promise.resolve(false)
  return new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once('error', (error: NodeJS.ErrnoException) => {
      if (error.code === 'EADDRINUSE') resolve(true)
      else reject(new Error(`cannot listen on ${host}:${port} for ${what}: ${error.message}`))
    })
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(false)))
  })
}
