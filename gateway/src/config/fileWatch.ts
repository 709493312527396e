import { statSync, unwatchFile, watchFile, type Stats } from 'node:fs'

/** How often a watched file's stat is polled: polling survives editors that replace the file and bind mounts alike. */
const WATCH_INTERVAL_MILLIS = 500

/**
 * What tells one version of a file from another: not its modification time alone, which a file
 * renamed over it may share (`cp -p`, `rsync -a`, archives with fixed times, one-second clocks).
 */
const fileVersion = (stats: Stats) => `${stats.dev}:${stats.ino}:${stats.size}:${stats.mtimeMs}:${stats.ctimeMs}`

/** The version of each file as it is now (stat follows links: a link moved to a new file is a change). */
export function versionOf(paths: readonly string[]): string {
  return paths
    .map((path) => {
      try {
        return fileVersion(statSync(path))
      } catch {
        return 'missing'
      }
    })
    .join('/')
}

/**
 * Calls `onChange` when any of `paths` changes; returns a function that stops watching. watchFile
 * takes its first stat asynchronously and compares later ones with it: a change made after the
 * caller's last read (`versionAtRead`, from versionOf) but before that first stat would never be
 * seen. One comparison, once the watcher has its baseline, closes that gap.
 *
 * A file that comes back after a spell of missing (its folder renamed away and back, a mount that
 * dropped) is reported with the stat from before it went missing: when it comes back unchanged the
 * two agree, though the caller last read it missing and refused it. So the caller's own version
 * counts too.
 */
export function watchFiles(paths: readonly string[], versionAtRead: () => string, onChange: () => void): () => void {
  const onStat = (now: Stats, before: Stats) => {
    if (fileVersion(now) !== fileVersion(before) || versionOf(paths) !== versionAtRead()) onChange()
  }
  for (const path of paths) watchFile(path, { interval: WATCH_INTERVAL_MILLIS }, onStat)
  const firstCheck = setTimeout(() => {
    if (versionOf(paths) !== versionAtRead()) onChange()
  }, WATCH_INTERVAL_MILLIS)
  firstCheck.unref()
  return () => {
    clearTimeout(firstCheck)
    for (const path of paths) unwatchFile(path, onStat)
  }
}
