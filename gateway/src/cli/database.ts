import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { DISCOVERY_FILE, ownerStillRunning } from '../../../common/src/database/discoveryFile.ts'
import { databaseUrlFromEnv } from '../../../common/src/env.ts'
import { CliError } from './errors.ts'

export interface DatabaseLocation {
  url: string
  /** Where the URL came from, for error messages; never the password. */
  source: string
}

const NO_DATABASE =
  'no database: set DATABASE_URL to the Postgres the gateway uses, or run `npm start` ' +
  '(without DATABASE_URL it serves an embedded database that this command finds on its own, ' +
  'in DATA_DIR when npm start was given one)'

/** DATABASE_URL, else the embedded database of the `npm start` running on DATA_DIR. */
export async function locateDatabase(env: NodeJS.ProcessEnv = process.env): Promise<DatabaseLocation> {
  if (env.DATABASE_URL) {
    try {
      return { url: databaseUrlFromEnv(env), source: 'DATABASE_URL' }
    } catch (error) {
      throw new CliError((error as Error).message)
    }
  }
  const file = path.join(path.resolve(env.DATA_DIR || 'data'), DISCOVERY_FILE)
  let text: string
  try {
    text = await readFile(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') throw new CliError(`${NO_DATABASE}; ${file} does not exist`)
    throw new CliError(`${NO_DATABASE}; ${file} cannot be read (${(error as NodeJS.ErrnoException).code ?? 'error'})`)
  }
  let record: { url?: unknown; pid?: unknown; started?: unknown }
  try {
    record = JSON.parse(text) as typeof record
  } catch {
    record = {}
  }
  const { url, pid, started } = record
  if (typeof url !== 'string' || typeof pid !== 'number' || !Number.isInteger(pid) || pid <= 0) {
    throw new CliError(`${NO_DATABASE}; ${file} is not a valid discovery file`)
  }
  // The pid alone may be a later process's: the record also says which process wrote it.
  if (!ownerStillRunning({ url, pid, ...(typeof started === 'string' ? { started } : {}) })) {
    throw new CliError(`${NO_DATABASE}; ${file} was left by an \`npm start\` (pid ${pid}) that is no longer running`)
  }
  return { url, source: `the embedded database of \`npm start\` (pid ${pid}, found through ${file})` }
}

