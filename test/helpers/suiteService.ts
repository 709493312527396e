import { afterAll, beforeAll } from 'vitest'

/**
 * A service a describe block (or file) shares, such as a pets-service or a gateway: started in a
 * beforeAll, closed in an afterAll. What it returns stands for the started service in hooks and
 * tests (it forwards to what `start` resolved to) and throws if read before, while the suite is
 * being collected. Calls made in the order the services depend on each other (suiteDatabase()
 * first) start them in that order and, as vitest runs "after" hooks in reverse, close them in the
 * reverse one.
 */
export function suiteService<T extends { close(): Promise<void> }>(start: () => Promise<T>): T {
  let service: T | undefined
  beforeAll(async () => {
    service = await start()
  })
  afterAll(async () => {
    await service?.close()
  })
  const started = (): T => {
    if (!service) throw new Error('a suite service is started in beforeAll: use it in a hook or a test')
    return service
  }
  return new Proxy({} as T, {
    get: (_target, property) => Reflect.get(started(), property),
    set: (_target, property, value) => Reflect.set(started(), property, value),
  })
}
