import { readFileSync } from 'node:fs'

/**
 * The file by which a running `npm start` that serves the embedded database is found, in its data
 * directory (`DATA_DIR`, default `./data`): written by scripts/lib/embeddedDatabase.ts, read by it
 * and by the keys CLI. Nothing here loads PGlite, so the CLI can read it.
 */
export const DISCOVERY_FILE = 'embedded-postgres.json'

export interface EmbeddedDatabaseRecord {
  /** Where the running `npm start` serves Postgres (it may still be starting). */
  url: string
  /** The `npm start` process that owns the data directory. */
  pid: number
  /** Which process that pid was (processIdentity), where the system tells: a pid is reused. */
  started?: string
}

/**
 * What tells one process from a later one given the same pid, on Linux: the boot and the
 * process's start time since it (field 22 of /proc/<pid>/stat). Undefined where that cannot be read.
 */
export function processIdentity(pid: number): string | undefined {
  try {
    const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim()
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // "pid (comm) state ppid …": comm may hold spaces and parentheses, so count after the last ')'.
    const startTime = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
    return startTime ? `${boot}:${startTime}` : undefined
  } catch {
    return undefined
  }
}

export function processIsAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    // EPERM: the process exists but belongs to someone else.
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/**
 * Whether the `npm start` a record names still runs: its pid is alive and, where the system tells
 * processes apart (processIdentity), it is the very process that wrote the record, not a later one
 * given the same pid.
 */
export function ownerStillRunning(record: EmbeddedDatabaseRecord): boolean {
  if (!processIsAlive(record.pid)) return false
  const now = record.started === undefined ? undefined : processIdentity(record.pid)
  return now === undefined || now === record.started
}
