/**
 * Preloaded (`node --import`) into every child that `npm start` runs. The children live in
 * their own process groups so that a Ctrl-C in the terminal reaches only `npm start`, which
 * then stops them one by one; the price is that a SIGKILLed or crashed `npm start` would leave
 * them running and holding their ports. The IPC channel to the parent closes when the parent
 * dies however it dies, and the child then shuts itself down the ordinary way (SIGTERM).
 */
if (process.channel) {
  process.once('disconnect', () => {
    process.kill(process.pid, 'SIGTERM')
  })
  // Watching the channel must not keep a child alive that would otherwise have exited.
  process.channel.unref()
}

export {}
