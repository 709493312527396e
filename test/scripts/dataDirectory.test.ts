import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { afterEach, describe, expect, it } from 'vitest'
import { SOCKET_PATH_MAX_BYTES, socketUrl } from '../../common/src/database/embeddedPostgres.ts'
import {
  claimDataDirectory,
  makeDataDirectory,
  ownerRecord,
  releaseDataDirectory,
  removeTemporarySocketDirectory,
  socketDirectoryFor,
} from '../../scripts/lib/embeddedDatabase.ts'

describe("npm start's data folder", () => {
  const made: string[] = []
  afterEach(() => {
    for (const directory of made.splice(0)) rmSync(directory, { recursive: true, force: true })
  })

  /** A data folder whose socket path would be longer than a socket path can be. */
  function tooDeepForASocket(): string {
    const parent = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(parent)
    const dataDir = path.join(parent, 'd'.repeat(SOCKET_PATH_MAX_BYTES), 'data')
    mkdirSync(dataDir, { recursive: true })
    return dataDir
  }

  /** An existing folder, open to others (0755), holding `files` (name: content; a name ending in / is a folder). */
  function existingFolder(files: Record<string, string> = {}): string {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(dataDir)
    chmodSync(dataDir, 0o755)
    for (const [name, content] of Object.entries(files)) {
      if (name.endsWith('/')) mkdirSync(path.join(dataDir, name), { recursive: true })
      else writeFileSync(path.join(dataDir, name), content)
    }
    return dataDir
  }

  it("is refused when it already holds other files (DATA_DIR=$HOME, a project): an error naming it, its mode and files untouched", async () => {
    const dataDir = existingFolder({ 'notes.txt': 'mine', 'src/': '', 'src/main.c': 'int main;' })
    await expect(makeDataDirectory(dataDir)).rejects.toThrow(
      `DATA_DIR ${dataDir} holds other files and no embedded database of npm start (no pglite/PG_VERSION); ` +
        'npm start left it untouched: set DATA_DIR to an empty or new folder',
    )
    expect(statSync(dataDir).mode & 0o777).toBe(0o755)
    expect(readdirSync(dataDir, { recursive: true }).sort()).toEqual(['notes.txt', 'src', path.join('src', 'main.c')])
  })

  it('is refused when it is a file', async () => {
    const file = path.join(existingFolder({ 'notes.txt': 'mine' }), 'notes.txt')
    await expect(makeDataDirectory(file)).rejects.toThrow(`DATA_DIR ${file} is not a folder; npm start left it untouched`)
  })

  it.each([
    ['an empty folder', {}],
    ['the root of a new ext4 file system (a disk mounted for the data)', { 'lost+found/': '' }],
    ['the data folder of a previous run (any version so far), with a file of the user beside the database', { 'pglite/': '', 'pglite/PG_VERSION': '17\n', 'backup.sql': '--' }],
    ['one where a first start was killed while it created the database', { 'embedded-postgres.json': '{}', 'pglite.creating/': '', '.s.PGSQL.54329': '' }],
    ['one with a partial database set aside and a claim being written', { 'pglite/': '', 'pglite.incomplete-2026-11-22T02-20-18.000Z/': '', 'embedded-postgres.json.4242.claim': '{}', 'embedded-postgres.json.4242.tmp': '{}' }],
  ])('is taken when it is %s', async (_, files: Record<string, string>) => {
    const dataDir = existingFolder(files)
    expect(await makeDataDirectory(dataDir)).toBeUndefined()
    await claimDataDirectory(dataDir, ownerRecord('postgres://postgres@127.0.0.1:1/postgres'), { startingGraceMillis: 0 })
    try {
      expect(statSync(dataDir).mode & 0o777).toBe(0o700)
    } finally {
      releaseDataDirectory(dataDir)
    }
  })

  it('is made, with its missing parents, when it does not exist', async () => {
    const parent = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(parent)
    const dataDir = path.join(parent, 'new', 'data')
    expect(await makeDataDirectory(dataDir)).toBe(path.join(parent, 'new'))
    expect(statSync(dataDir).mode & 0o777).toBe(0o700)
  })

  it('is made private to its user (0700) when it already exists open to others, as PGlite writes most files 0666', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(dataDir)
    chmodSync(dataDir, 0o755)
    await claimDataDirectory(dataDir, ownerRecord('postgres://postgres@127.0.0.1:1/postgres'))
    try {
      expect(statSync(dataDir).mode & 0o777).toBe(0o700)
    } finally {
      releaseDataDirectory(dataDir)
    }
  })

  it('makes the database files PGlite wrote open to all (0666) private to its user', async () => {
    const dataDir = existingFolder({ 'pglite/': '', 'pglite/global/': '', 'pglite/global/1260': 'pg_authid', 'pglite/pg_wal/': '', 'pglite/pg_wal/000000010000000000000001': 'rows' })
    for (const name of ['pglite', 'pglite/global', 'pglite/pg_wal']) chmodSync(path.join(dataDir, name), 0o777)
    for (const name of ['pglite/global/1260', 'pglite/pg_wal/000000010000000000000001']) chmodSync(path.join(dataDir, name), 0o666)
    await claimDataDirectory(dataDir, ownerRecord('postgres://postgres@127.0.0.1:1/postgres'))
    try {
      const modes = Object.fromEntries(
        ['pglite', 'pglite/global', 'pglite/global/1260', 'pglite/pg_wal/000000010000000000000001'].map((name) => [name, (statSync(path.join(dataDir, name)).mode & 0o777).toString(8)]),
      )
      expect(modes).toEqual({ pglite: '700', 'pglite/global': '700', 'pglite/global/1260': '600', 'pglite/pg_wal/000000010000000000000001': '600' })
    } finally {
      releaseDataDirectory(dataDir)
    }
  })

  it('leaves alone what a symbolic link in the database folder names, and a link back to the folder itself', async () => {
    const outside = existingFolder({ 'shared.txt': 'not the database', 'sub/': '', 'sub/f': 'x' })
    chmodSync(path.join(outside, 'shared.txt'), 0o644)
    const dataDir = existingFolder({ 'pglite/': '', 'pglite/pg_tblspc/': '', 'pglite/PG_VERSION': '17' })
    chmodSync(path.join(dataDir, 'pglite/PG_VERSION'), 0o666)
    symlinkSync(outside, path.join(dataDir, 'pglite/pg_tblspc/16999'))
    symlinkSync(path.join(dataDir, 'pglite'), path.join(dataDir, 'pglite/pg_tblspc/loop'))
    await claimDataDirectory(dataDir, ownerRecord('postgres://postgres@127.0.0.1:1/postgres'))
    try {
      expect(statSync(path.join(dataDir, 'pglite/PG_VERSION')).mode & 0o777).toBe(0o600)
      expect(statSync(path.join(outside, 'shared.txt')).mode & 0o777).toBe(0o644)
      expect(statSync(path.join(outside, 'sub')).mode & 0o777).toBe(0o755)
    } finally {
      releaseDataDirectory(dataDir)
    }
  })

  // Another user's folder was used without a word: its owner could read the database's key hashes,
  // or plant a database whose keys it knows. Run as root, the test claims a root folder as nobody.
  const asNobody = process.getuid?.() === 0 && existsSync('/usr/sbin/runuser') ? undefined : 'needs root and runuser, to claim a folder as another user'
  it.skipIf(asNobody !== undefined)(`is refused when it belongs to another user, naming the owner, and nothing is written in it${asNobody ? ` (skipped: ${asNobody})` : ''}`, () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(dataDir)
    chmodSync(dataDir, 0o777)
    const claim = `const { claimDataDirectory, ownerRecord } = await import(${JSON.stringify(path.resolve('scripts/lib/embeddedDatabase.ts'))})
      await claimDataDirectory(${JSON.stringify(dataDir)}, ownerRecord('postgres://postgres@127.0.0.1:1/postgres')).then(() => console.log('claimed'), (error) => console.log(error.message))`
    const run = spawnSync('/usr/sbin/runuser', ['-u', 'nobody', '--', process.execPath, '--import', 'tsx', '--input-type=module', '-e', claim], { encoding: 'utf8', env: { ...process.env, HOME: '/tmp' } })
    expect(run.stdout.trim()).toBe(`DATA_DIR ${dataDir} belongs to another user (uid 0), who could read and change the embedded database in it; set DATA_DIR to a folder of your own`)
    expect(readdirSync(dataDir)).toEqual([])
  })

  it('holds the embedded database\'s Unix socket itself, made private, where psql -h <DATA_DIR> finds it', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(dataDir)
    chmodSync(dataDir, 0o755)
    expect(await socketDirectoryFor(dataDir, 54329)).toBe(dataDir)
    expect(statSync(dataDir).mode & 0o777).toBe(0o700)
    // Never removed as if it were a temporary socket folder.
    removeTemporarySocketDirectory(socketUrl(dataDir, 54329))
    expect(existsSync(dataDir)).toBe(true)
  })

  it('too deep for a socket path: the socket goes to a new private folder under the temporary directory, removed when the run ends', async () => {
    const dataDir = tooDeepForASocket()
    const directory = await socketDirectoryFor(dataDir, 54329)
    expect(path.dirname(directory)).toBe(os.tmpdir())
    expect(statSync(directory).mode & 0o777).toBe(0o700)
    removeTemporarySocketDirectory(socketUrl(directory, 54329))
    expect(existsSync(directory)).toBe(false)
  })

  it('a data folder where no socket can be made (a Windows drive under WSL, some bind mounts): the socket goes to a private temporary folder', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(dataDir)
    // Binding fails there: a folder already stands where the probe's socket would go.
    mkdirSync(path.join(dataDir, `.s.p${process.pid}`))
    const directory = await socketDirectoryFor(dataDir, 54329)
    expect(path.dirname(directory)).toBe(os.tmpdir())
    expect(statSync(directory).mode & 0o777).toBe(0o700)
    removeTemporarySocketDirectory(socketUrl(directory, 54329))
    expect(existsSync(directory)).toBe(false)
    // A folder that can hold one is used, and the probe leaves nothing behind.
    rmdirSync(path.join(dataDir, `.s.p${process.pid}`))
    expect(await socketDirectoryFor(dataDir, 54329)).toBe(dataDir)
    expect(readdirSync(dataDir)).toEqual([])
  })

  it('keeps the database of a data folder named like a temporary socket folder when a run on it crashed', async () => {
    // DATA_DIR=/tmp/aas-postgres-…: short enough for the socket, so the folder is also its socket folder.
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-postgres-'))
    made.push(dataDir)
    mkdirSync(path.join(dataDir, 'pglite'))
    writeFileSync(path.join(dataDir, 'pglite', 'PG_VERSION'), '17\n')
    expect(await socketDirectoryFor(dataDir, 54329)).toBe(dataDir)
    // What the next start does with the crashed run's record.
    removeTemporarySocketDirectory(socketUrl(dataDir, 54329))
    expect(existsSync(path.join(dataDir, 'pglite', 'PG_VERSION'))).toBe(true)
  })

  it("after a crash, removes the temporary socket folder with the socket the killed run left in it", async () => {
    const dataDir = tooDeepForASocket()
    const directory = await socketDirectoryFor(dataDir, 54329)
    made.push(directory)
    const killed = net.createServer()
    await new Promise<void>((resolve) => killed.listen(path.join(directory, '.s.PGSQL.54329'), resolve))
    try {
      removeTemporarySocketDirectory(socketUrl(directory, 54329))
      expect(existsSync(directory)).toBe(false)
    } finally {
      killed.close()
    }
  })

  it('with a relative TMPDIR, the socket still goes to a folder pg reaches as a socket (an absolute path), removed when the run ends', async () => {
    const dataDir = tooDeepForASocket()
    const temporary = mkdtempSync(path.join(os.tmpdir(), 'aas-tmp-'))
    made.push(temporary)
    const previous = process.env.TMPDIR
    process.env.TMPDIR = path.relative(process.cwd(), temporary)
    try {
      const directory = await socketDirectoryFor(dataDir, 54329)
      expect(path.isAbsolute(directory)).toBe(true)
      removeTemporarySocketDirectory(socketUrl(directory, 54329))
      expect(readdirSync(temporary)).toEqual([])
    } finally {
      if (previous === undefined) delete process.env.TMPDIR
      else process.env.TMPDIR = previous
    }
  })
})
