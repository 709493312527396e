/**
 * Progress on stderr. On a terminal: one line redrawn in place (phase, target, round, elapsed,
 * ETA, a bar), with every message printed above it. Anywhere else (a pipe, a CI log): the plain
 * `[bench] …` lines only, one per message, no escape codes.
 */

/** m:ss, or h:mm:ss from an hour on. */
export function formatDuration(seconds: number): string {
  const total = Math.max(0, Math.round(seconds))
  const hours = Math.floor(total / 3600)
  const minutes = Math.floor((total % 3600) / 60)
  const rest = String(total % 60).padStart(2, '0')
  return hours > 0 ? `${hours}:${String(minutes).padStart(2, '0')}:${rest}` : `${minutes}:${rest}`
}

export interface ProgressState {
  /** "warm-up", "closed 100 conn", "open 50 %". */
  phase: string
  target: string
  /** 1-based; 0 for the warm-up (no round shown). */
  round: number
  rounds: number
  elapsedSeconds: number
  /** Undefined before anything is known. */
  etaSeconds?: number
  /** Done so far, 0..1. */
  fraction: number
}

/**
 * The redrawn line, at most `width` characters: the bar shrinks first, then the target name is
 * cut, so phase, round, elapsed and ETA stay readable in a narrow terminal.
 */
export function formatProgressLine(state: ProgressState, width: number): string {
  const fraction = Math.min(1, Math.max(0, state.fraction))
  const percent = `${String(Math.floor(fraction * 100)).padStart(3)} %`
  const round = state.round > 0 ? ` round ${state.round}/${state.rounds}` : ''
  const eta = state.etaSeconds === undefined ? 'ETA ?' : `ETA ${formatDuration(state.etaSeconds)}`
  const tail = ` ·${round} · ${formatDuration(state.elapsedSeconds)} elapsed · ${eta}`
  const head = `[bench] ${state.phase} · `
  const fixedWidth = head.length + tail.length + percent.length + 1
  let target = state.target
  let barWidth = Math.min(30, width - fixedWidth - target.length - 3)
  if (barWidth < 5) {
    barWidth = 0
    const room = width - fixedWidth
    if (target.length > room) target = room > 1 ? `${target.slice(0, room - 1)}…` : ''
  }
  const filled = Math.round(fraction * barWidth)
  const bar = barWidth > 0 ? `[${'#'.repeat(filled)}${'-'.repeat(barWidth - filled)}] ` : ''
  const line = `${head}${target}${tail} ${bar}${percent}`
  return line.length > width ? line.slice(0, Math.max(0, width)) : line
}

export interface ProgressStream {
  write(text: string): unknown
  isTTY?: boolean
  columns?: number
}

export interface Progress {
  /** A message: above the bar on a terminal, a plain `[bench] …` line otherwise. */
  log(message: string): void
  /** The step now running and the planned work left after it starts (seconds). */
  update(state: Omit<ProgressState, 'elapsedSeconds'>): void
  /** Removes the bar (before the tables go to stdout). */
  done(): void
}

export function createProgress(stream: ProgressStream = process.stderr, now: () => number = Date.now): Progress {
  const started = now()
  const tty = stream.isTTY === true
  let state: Omit<ProgressState, 'elapsedSeconds'> | undefined
  let timer: ReturnType<typeof setInterval> | undefined
  const elapsed = () => (now() - started) / 1000
  const draw = () => {
    if (!tty || state === undefined) return
    stream.write(`\r\x1b[2K${formatProgressLine({ ...state, elapsedSeconds: elapsed() }, (stream.columns ?? 100) - 1)}`)
  }
  const clear = () => {
    if (tty && state !== undefined) stream.write('\r\x1b[2K')
  }
  return {
    log(message) {
      clear()
      stream.write(`[bench] ${message}\n`)
      draw()
    },
    update(next) {
      state = next
      if (tty && timer === undefined) {
        timer = setInterval(draw, 1_000)
        timer.unref()
      }
      draw()
    },
    done() {
      if (timer !== undefined) clearInterval(timer)
      timer = undefined
      clear()
      state = undefined
    },
  }
}

/**
 * ETA from the plan: the planned seconds left, scaled by how much longer than planned the steps
 * done so far took (start-up, /proc reads, a slow machine), never below the plan.
 */
export function estimateRemaining(plannedDone: number, plannedLeft: number, elapsedSinceFirstStep: number): number {
  if (plannedDone <= 0) return plannedLeft
  return plannedLeft * Math.max(1, elapsedSinceFirstStep / plannedDone)
}
