/**
 * A log line that repeats without flooding: the first event is said at once, then the events of
 * each `intervalMillis` are counted and said together at its end, with how many and the last of
 * them; an interval without one ends the quiet, so the next event is said at once again.
 */
export function countedLines<T>(intervalMillis: number, say: (last: T, count: number) => void): (event: T) => void {
  let quiet: { count: number; last?: T } | undefined
  const quietFor = () => {
    const since: { count: number; last?: T } = { count: 0 }
    quiet = since
    setTimeout(() => {
      quiet = undefined
      if (since.count === 0) return
      say(since.last as T, since.count)
      quietFor()
    }, intervalMillis).unref()
  }
  return (event) => {
    if (quiet) {
      quiet.count++
      quiet.last = event
      return
    }
    say(event, 1)
    quietFor()
  }
}

/**
 * countedLines for each key apart: a flood of one kind (a handshake failure's reason, a Postgres
 * outage's cause) does not hide the first of another. At most `maxKeys` kinds are kept; past
 * them the counts start again.
 */
export function countedLinesByKey<K, T>(intervalMillis: number, say: (key: K, last: T, count: number) => void, maxKeys = Number.POSITIVE_INFINITY): (key: K, event: T) => void {
  const lines = new Map<K, (event: T) => void>()
  return (key, event) => {
    let line = lines.get(key)
    if (line === undefined) {
      if (lines.size >= maxKeys) lines.clear()
      line = countedLines<T>(intervalMillis, (last, count) => say(key, last, count))
      lines.set(key, line)
    }
    line(event)
  }
}
