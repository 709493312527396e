import { LRUCache } from 'lru-cache'
import type { LimitDecision, LimitRequest, LimitStore, WindowSpec, WindowState } from './limitStore.ts'

/**
 * The in-process store: the Lua script's algorithm in TypeScript, for `npm start` without Redis
 * and as the per-process fallback when Redis fails. Valid for one gateway process only.
 */
interface Ring {
  head: number
  counts: number[]
}

interface KeyState {
  minute: Ring
  day: Ring
  strikes: number
  strikeStart: number
  banUntil: number
  level: number
  levelUntil: number
}

function bucketsOf(spec: WindowSpec): number {
  return Math.floor(spec.windowMillis / spec.bucketMillis)
}

function freshRing(spec: WindowSpec): Ring {
  return { head: 0, counts: new Array<number>(bucketsOf(spec) + 1).fill(0) }
}

function advance(ring: Ring, current: number): void {
  const n = ring.counts.length
  if (current <= ring.head) return
  if (current - ring.head >= n) ring.counts.fill(0)
  else for (let index = ring.head + 1; index <= current; index++) ring.counts[index % n] = 0
  ring.head = current
}

const sum = (ring: Ring) => ring.counts.reduce((total, count) => total + count, 0)

function freedAt(ring: Ring, spec: WindowSpec, need: number, now: number): number {
  if (need <= 0) return now
  const buckets = bucketsOf(spec)
  const n = ring.counts.length
  let freed = 0
  for (let index = ring.head - buckets; index <= ring.head; index++) {
    freed += ring.counts[((index % n) + n) % n] ?? 0
    if (freed >= need) return (index + buckets + 1) * spec.bucketMillis
  }
  return (ring.head + buckets + 1) * spec.bucketMillis
}

function windowState(ring: Ring, spec: WindowSpec, now: number): WindowState {
  const buckets = bucketsOf(spec)
  const n = ring.counts.length
  let resetMillis = now
  for (let index = ring.head - buckets; index <= ring.head; index++) {
    if ((ring.counts[((index % n) + n) % n] ?? 0) > 0) {
      resetMillis = (index + buckets + 1) * spec.bucketMillis
      break
    }
  }
  return { limit: spec.limit, remaining: Math.max(spec.limit - sum(ring), 0), resetMillis }
}

export function createMemoryStore(options: { maxKeys?: number; clock?: () => number } = {}): LimitStore {
  const clock = options.clock ?? Date.now
  // Bounded like the key cache: memory stays flat whatever the number of keys.
  const states = new LRUCache<string, KeyState>({ max: options.maxKeys ?? 200_000, ttlAutopurge: false })

  return {
    kind: 'memory',
    async consume(request: LimitRequest): Promise<LimitDecision> {
      const now = request.nowMillis ?? clock()
      let state = states.get(request.keyId)
      const shapeChanged =
        state &&
        (state.minute.counts.length !== bucketsOf(request.minute) + 1 ||
          state.day.counts.length !== bucketsOf(request.day) + 1)
      if (!state || shapeChanged) {
        state = {
          minute: freshRing(request.minute),
          day: freshRing(request.day),
          strikes: state?.strikes ?? 0,
          strikeStart: state?.strikeStart ?? 0,
          banUntil: state?.banUntil ?? 0,
          level: state?.level ?? 0,
          levelUntil: state?.levelUntil ?? 0,
        }
      }
      advance(state.minute, Math.floor(now / request.minute.bucketMillis))
      advance(state.day, Math.floor(now / request.day.bucketMillis))

      let outcome: LimitDecision['outcome'] = 'admitted'
      let retryAfterMillis = 0
      let banStep = 0
      let newBan = false
      const minuteSum = sum(state.minute)
      const daySum = sum(state.day)
      if (state.banUntil > now) {
        outcome = 'banned'
        retryAfterMillis = state.banUntil - now
        banStep = Math.max(state.level - 1, 0)
      } else if (minuteSum + 1 <= request.minute.limit && daySum + 1 <= request.day.limit) {
        const m = state.minute
        const d = state.day
        m.counts[m.head % m.counts.length]! += 1
        d.counts[d.head % d.counts.length]! += 1
      } else {
        outcome = 'limited'
        const waitUntil = Math.max(
          freedAt(state.minute, request.minute, minuteSum + 1 - request.minute.limit, now),
          freedAt(state.day, request.day, daySum + 1 - request.day.limit, now),
        )
        retryAfterMillis = waitUntil - now
        if (now - state.strikeStart >= request.bans.strikeWindowMillis) {
          state.strikes = 0
          state.strikeStart = now
        }
        state.strikes += 1
        if (state.strikes >= request.bans.strikes) {
          if (state.levelUntil <= now) state.level = 0
          banStep = Math.min(state.level, request.bans.ladderMillis.length - 1)
          state.banUntil = now + (request.bans.ladderMillis[banStep] ?? 0)
          state.level += 1
          state.levelUntil = now + request.bans.memoryMillis
          state.strikes = 0
          outcome = 'banned'
          retryAfterMillis = state.banUntil - now
          newBan = true
        }
      }
      const ttl = Math.max(
        request.day.windowMillis + request.day.bucketMillis,
        request.minute.windowMillis + request.minute.bucketMillis,
        state.banUntil - now,
        state.levelUntil - now,
      )
      states.set(request.keyId, state, { ttl: Math.ceil(ttl) })
      return {
        outcome,
        nowMillis: now,
        minute: windowState(state.minute, request.minute, now),
        day: windowState(state.day, request.day, now),
        retryAfterMillis: Math.ceil(retryAfterMillis),
        banStep,
        newBan,
      }
    },
    async unban(keyId: string) {
      const state = states.get(keyId)
      if (!state) return
      state.banUntil = 0
      state.strikes = 0
      state.strikeStart = 0
    },
    async close() {
      states.clear()
    },
  }
}
