import { existsSync, readFileSync } from 'node:fs'

/**
 * Notices that the process which launched `npm start` (or `npm run start:gateway`, `start:pets`)
 * is gone, so what it started never outlives it.
 *
 * `npm start` is a chain: npm runs `sh -c "node --import tsx scripts/start.ts"`, and sh runs
 * node (tsx's CLI is not used: it relays a signal to its child and SIGKILLs it unless the child
 * acknowledges within 60 ms, which a service busy under load, or the embedded Postgres in the
 * middle of a statement, does not). A signal sent to npm alone does not travel down the chain:
 * npm forwards SIGTERM to sh only (sh dies, node is left running) and does not forward SIGHUP at
 * all (npm dies, sh and node are left running). Either way a link of the chain breaks: some process's
 * parent is no longer the one it had. Every `intervalMillis` this checks each link, from this
 * process up to npm, and calls `onGone` once the first one breaks.
 *
 * The links above this process's own parent are read from /proc (Linux): the wrappers npm
 * started for this script are the ancestors that carry its `npm_lifecycle_script`, and npm is the
 * first one above them that does not. Elsewhere, or when not run through npm, only the direct
 * parent is watched (process.ppid). The timer is unref'd: it never keeps the process alive.
 */
export function watchLauncher(onGone: (launcher: string) => void, intervalMillis = 500): () => void {
  const links = launchChain()
  const top = links[links.length - 1]!
  const launcher = process.env.npm_lifecycle_script && links.length > 1 ? `npm (pid ${top.parent})` : `the parent process (pid ${top.parent})`
  const timer = setInterval(() => {
    if (links.every((link) => parentOf(link.pid) === link.parent)) return
    clearInterval(timer)
    onGone(launcher)
  }, intervalMillis)
  timer.unref()
  return () => clearInterval(timer)
}

interface Link {
  pid: number
  parent: number
}

const MAX_WRAPPERS = 8

/** [this process → its parent, parent → grandparent, …, last wrapper → npm]. */
export function launchChain(): Link[] {
  const links: Link[] = [{ pid: process.pid, parent: process.ppid }]
  const script = process.env.npm_lifecycle_script
  if (!script || !existsSync('/proc/self/stat')) return links
  const marker = `npm_lifecycle_script=${script}`
  for (let depth = 0; depth < MAX_WRAPPERS; depth++) {
    const pid = links[links.length - 1]!.parent
    if (pid <= 1 || !environmentOf(pid).includes(marker)) break
    const parent = parentOf(pid)
    if (parent === undefined) break
    links.push({ pid, parent })
  }
  return links
}

/** The parent pid of `pid`, or undefined when that process is gone. */
function parentOf(pid: number): number | undefined {
  if (pid === process.pid) return process.ppid
  try {
    // "pid (comm) state ppid …"; comm may hold spaces and parentheses, so read after the last ')'.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    // A zombie has exited: its parent has not collected it yet.
    if (fields[0] === 'Z') return undefined
    return Number(fields[1])
  } catch {
    return undefined
  }
}

function environmentOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')
  } catch {
    return []
  }
}
