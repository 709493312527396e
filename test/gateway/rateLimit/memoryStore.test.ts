import { createMemoryStore } from '../../../gateway/src/rateLimit/memoryStore.ts'
import { describeLimitStore } from './store.suite.ts'

describeLimitStore('in-process memory', async () => {
  const store = createMemoryStore()
  return { store, close: () => store.close() }
})
