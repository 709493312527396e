import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { CliError } from './errors.ts'

/**
 * Written by a running `npm start` that serves the embedded database: `{ url, pid }` in
 * `<DATA_DIR or ./data>/embedded-postgres.json` (see scripts/lib/embeddedDatabase.ts, which
 * this file only reads; importing that module would load PGlite into the CLI).
 */
export const DISCOVERY_FILE = 'embedded-postgres.json'

export interface DatabaseLocation {
  url: string
  /** Where the URL came from, for error messages; never the password. */
  source: string
}

const NO_DATABASE =
  'no database: set DATABASE_URL to the Postgres the gateway uses, or run `npm start` ' +
  '(without DATABASE_URL it serves an embedded database that this command finds on its own, ' +
  'in DATA_DIR when npm start was given one)'

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/** DATABASE_URL, else the embedded database of the `npm start` running on DATA_DIR. */
export async function locateDatabase(env: NodeJS.ProcessEnv = process.env): Promise<DatabaseLocation> {
  if (env.DATABASE_URL) return { url: env.DATABASE_URL, source: 'DATABASE_URL' }
  const file = path.join(path.resolve(env.DATA_DIR || 'data'), DISCOVERY_FILE)
  let text: string
  try {
    text = await readFile(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') throw new CliError(`${NO_DATABASE}; ${file} does not exist`)
    throw new CliError(`${NO_DATABASE}; ${file} cannot be read (${(error as NodeJS.ErrnoException).code ?? 'error'})`)
  }
  let record: { url?: unknown; pid?: unknown }
  try {
    record = JSON.parse(text) as typeof record
  } catch {
    record = {}
  }
  const { url, pid } = record
  if (typeof url !== 'string' || typeof pid !== 'number' || !Number.isInteger(pid) || pid <= 0) {
    throw new CliError(`${NO_DATABASE}; ${file} is not a valid discovery file`)
  }
  if (!isAlive(pid)) {
    throw new CliError(`${NO_DATABASE}; ${file} was left by an \`npm start\` (pid ${pid}) that is no longer running`)
  }
  return { url, source: `the embedded database of \`npm start\` (pid ${pid}, found through ${file})` }
}

/** The URL without its password, fit for an error message. */
export function printableUrl(url: string): string {
  try {
    const parsed = new URL(url)
    if (parsed.password) parsed.password = '***'
    return parsed.toString()
  } catch {
    return '(an unparsable URL)'
  }
}
