/**
 * How many of a file's side-by-side tests may have a process at work at once: each start of a
 * gateway or pets-service costs seconds of CPU, and a 2-core machine shared with another worker
 * takes no more without starving them all (each then misses its own start-up bounds). `take`
 * resolves, once a turn is free, with the function that gives it back. Tests that wait for a turn
 * need a timeout with room for it.
 */
export function turns(count: number): { take(): Promise<() => void> } {
  let free = count
  const waiting: (() => void)[] = []
  return {
    async take() {
      if (free > 0) free--
      else await new Promise<void>((resolve) => waiting.push(resolve))
      let given = false
      return () => {
        if (given) return
        given = true
        const next = waiting.shift()
        if (next) next()
        else free++
      }
    },
  }
}
