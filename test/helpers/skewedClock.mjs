import process from 'node:process'

// Preloaded (`node --import`) into a process whose wall clock is to be off by SKEWED_CLOCK_MILLIS
// (a machine with a wrong clock): Date.now() and new Date() move; monotonic clocks do not.
const skew = Number(process.env.SKEWED_CLOCK_MILLIS ?? 0)
const RealDate = Date
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(RealDate.now() + skew)
    else super(...args)
  }

  static now() {
    return RealDate.now() + skew
  }
}
