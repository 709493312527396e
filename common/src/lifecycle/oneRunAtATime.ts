/** A call of work that runs one at a time (oneRunAtATime). */
export interface OneRunAtATime {
  (): Promise<void>
  /** Resolves once no run is under way (at once when none is); starts none. */
  idle(): Promise<void>
}

/**
 * `work` run one call at a time. A call while a run is under way asks for one more run after it
 * (however many such calls come) and resolves when that run ends, so what it asked for is covered
 * without runs overlapping or an older one ending after a newer one. `goOn` can stop the further
 * runs (a stopped service). `work` settles its own failures.
 */
export function oneRunAtATime(work: () => Promise<void>, goOn: () => boolean = () => true): OneRunAtATime {
  let running: Promise<void> | undefined
  let again = false
  const call = () => {
    if (running) {
      again = true
      return running
    }
    running = (async () => {
      do {
        again = false
        await work()
      } while (again && goOn())
    })().finally(() => {
      running = undefined
    })
    return running
  }
  return Object.assign(call, { idle: async () => void (await running) })
}
