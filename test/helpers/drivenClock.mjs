import { performance } from 'node:perf_hooks'
import process from 'node:process'

// Preloaded (`node --import`) into a process whose monotonic clock a test moves forward, for
// minutes to pass as the process sees them without being waited out: at each SIGUSR2,
// performance.now() jumps DRIVEN_CLOCK_STEP_MILLIS ahead and a line on stderr says so (the test
// waits for it). Timers and the wall clock are not moved.
const step = Number(process.env.DRIVEN_CLOCK_STEP_MILLIS ?? 0)
const realNow = performance.now.bind(performance)
let ahead = 0
performance.now = () => realNow() + ahead
process.on('SIGUSR2', () => {
  ahead += step
  process.stderr.write(`driven clock: ${ahead} ms ahead\n`)
})
