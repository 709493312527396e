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
