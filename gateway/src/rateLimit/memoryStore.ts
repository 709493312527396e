import { LRUCache } from 'lru-cache'
import { UNBAN_APPLIED_MILLIS } from './limitStore.ts'
import type { LimitDecision, LimitRequest, LimitStore, UnbanOptions, WindowSpec, WindowState } from './limitStore.ts'
import { BAN_MEMORY_MILLIS } from './planLimits.ts'

interface Ring {
  /** Bucket length (ms) the ring was kept with. */
  bucketMillis: number
  head: number
  counts: number[]
}

interface KeyState {
  minute: Ring
  /** Strikes per minute bucket, aligned with the minute ring (its head serves both). */
  strikes: number[]
  day: Ring
  banUntil: number
  level: number
  levelUntil: number
}

function bucketsOf(spec: WindowSpec): number {
  return Math.floor(spec.windowMillis / spec.bucketMillis)
}

const slot = (index: number, n: number) => ((index % n) + n) % n

const sum = (counts: number[]) => counts.reduce((total, count) => total + count, 0)

function freshRing(spec: WindowSpec, now: number): Ring {
  return { bucketMillis: spec.bucketMillis, head: Math.floor(now / spec.bucketMillis), counts: new Array<number>(bucketsOf(spec) + 1).fill(0) }
}

const sameShape = (ring: Ring, spec: WindowSpec) => ring.bucketMillis === spec.bucketMillis && ring.counts.length === bucketsOf(spec) + 1

/**
 * A ring kept under other window settings, in the new ones: each old bucket's requests counted in
 * the new bucket holding its last moment (none leaves the window sooner than it would have), those
 * the new window no longer holds dropped. `counts` are the old ring's or its paired strikes.
 */
function carried(old: Ring, counts: number[], into: Ring): number[] {
  const n = into.counts.length
  const result = new Array<number>(n).fill(0)
  const oldN = old.counts.length
  for (let index = old.head - oldN + 1; index <= old.head; index++) {
    const count = counts[slot(index, oldN)] ?? 0
    if (count === 0) continue
    const at = Math.min(Math.floor(((index + 1) * old.bucketMillis - 1) / into.bucketMillis), into.head)
    if (at > into.head - n) result[slot(at, n)]! += count
  }
  return result
}

/**
 * Moves a ring (and the counts paired with it) to the current bucket, zeroing the buckets it
 * skipped. A head ahead of the clock by less than a window stays; one ahead by more keeps its
 * requests, all counted as of now.
 */
function advance(ring: Ring, current: number, paired?: number[]): void {
  if (current <= ring.head && ring.head - current < ring.counts.length) return
  moveTo(ring.counts, ring.head, current)
  if (paired) moveTo(paired, ring.head, current)
  ring.head = current
}

function moveTo(counts: number[], head: number, current: number): void {
  const n = counts.length
  if (current < head) {
    const total = sum(counts)
    counts.fill(0)
    counts[slot(current, n)] = total
  } else if (current - head >= n) {
    counts.fill(0)
  } else {
    for (let index = head + 1; index <= current; index++) counts[slot(index, n)] = 0
  }
}

function freedAt(ring: Ring, spec: WindowSpec, need: number, now: number): number {
  if (need <= 0) return now
  const buckets = bucketsOf(spec)
  const n = ring.counts.length
  let freed = 0
  for (let index = ring.head - buckets; index <= ring.head; index++) {
    freed += ring.counts[slot(index, n)] ?? 0
    if (freed >= need) return (index + buckets + 1) * spec.bucketMillis
  }
  return (ring.head + buckets + 1) * spec.bucketMillis
}

/**
 * Reset: when the oldest counted request leaves; for a spent window, when a request would be
 * admitted again (later than that when a lowered limit left the window holding more than it).
 */
function windowState(ring: Ring, spec: WindowSpec, now: number): WindowState {
  const total = sum(ring.counts)
  const remaining = Math.max(spec.limit - total, 0)
  if (remaining === 0) return { limit: spec.limit, remaining, resetMillis: freedAt(ring, spec, total + 1 - spec.limit, now) }
  const buckets = bucketsOf(spec)
  const n = ring.counts.length
  let resetMillis = now
  for (let index = ring.head - buckets; index <= ring.head; index++) {
    if ((ring.counts[slot(index, n)] ?? 0) > 0) {
      resetMillis = (index + buckets + 1) * spec.bucketMillis
      break
    }
  }
  return { limit: spec.limit, remaining, resetMillis }
}

/** The key's state in the request's window settings, carried over from other ones when they changed. */
function stateFor(previous: KeyState | undefined, request: LimitRequest, now: number): KeyState {
  if (previous && sameShape(previous.minute, request.minute) && sameShape(previous.day, request.day)) return previous
  const minute = freshRing(request.minute, now)
  const day = freshRing(request.day, now)
  if (!previous) return { minute, strikes: new Array<number>(minute.counts.length).fill(0), day, banUntil: 0, level: 0, levelUntil: 0 }
  const strikes = carried(previous.minute, previous.strikes, minute)
  minute.counts = carried(previous.minute, previous.minute.counts, minute)
  day.counts = carried(previous.day, previous.day.counts, day)
  return { minute, strikes, day, banUntil: previous.banUntil, level: previous.level, levelUntil: previous.levelUntil }
}

interface MemoryStoreOptions {
  maxKeys?: number
  clock?: () => number
  /** Called when a key's state is dropped for room: that key starts again from empty windows. */
  onFull?: () => void
}

/**
 * The in-process store: the Lua script's algorithm in TypeScript, for `npm start` without Redis
 * and as the per-process fallback when Redis fails. Valid for one gateway process only.
 */
export function createMemoryStore(options: MemoryStoreOptions = {}): LimitStore {
  const clock = options.clock ?? Date.now
  const onFull = options.onFull
  // Bounded like the key cache: memory stays flat whatever the number of keys.
  const states = new LRUCache<string, KeyState>({
    max: options.maxKeys ?? 200_000,
    ttlAutopurge: false,
    // A state pushed out for room while it still counts (an expired one is no loss).
    ...(onFull
      ? { dispose: (_state: KeyState, keyId: string, reason: string) => reason === 'evict' && states.getRemainingTTL(keyId) > 0 && onFull() }
      : {}),
  })
  /** The unbans applied, by change id: a repeat must not lift a ban the key earned since. */
  const unbansApplied = new LRUCache<number, true>({ max: 10_000, ttl: UNBAN_APPLIED_MILLIS, ttlAutopurge: false })

  return {
    kind: 'memory',
    async consume(request: LimitRequest): Promise<LimitDecision> {
      const now = request.nowMillis ?? clock()
      const state = stateFor(states.get(request.keyId), request, now)
      advance(state.minute, Math.floor(now / request.minute.bucketMillis), state.strikes)
      advance(state.day, Math.floor(now / request.day.bucketMillis))

      let outcome: LimitDecision['outcome'] = 'admitted'
      let retryAfterMillis = 0
      let banStep = 0
      let newBan = false
      const minuteSum = sum(state.minute.counts)
      const daySum = sum(state.day.counts)
      // When both windows would let one more request in (a ban's Retry-After is never earlier).
      const windowsFreeAt = () =>
        Math.max(
          freedAt(state.minute, request.minute, minuteSum + 1 - request.minute.limit, now),
          freedAt(state.day, request.day, daySum + 1 - request.day.limit, now),
        )
      if (state.banUntil > now) {
        outcome = 'banned'
        retryAfterMillis = Math.max(state.banUntil, windowsFreeAt()) - now
        banStep = Math.max(state.level - 1, 0)
      } else if (minuteSum + 1 <= request.minute.limit && daySum + 1 <= request.day.limit) {
        const m = state.minute
        const d = state.day
        m.counts[slot(m.head, m.counts.length)]! += 1
        d.counts[slot(d.head, d.counts.length)]! += 1
      } else {
        outcome = 'limited'
        const freeAt = windowsFreeAt()
        retryAfterMillis = freeAt - now
        state.strikes[slot(state.minute.head, state.strikes.length)]! += 1
        if (sum(state.strikes) >= request.bans.strikes) {
          if (state.levelUntil <= now) state.level = 0
          banStep = Math.min(state.level, request.bans.ladderMillis.length - 1)
          state.banUntil = now + (request.bans.ladderMillis[banStep] ?? 0)
          state.level += 1
          // The next ban climbs if it comes within the memory of this one's end.
          state.levelUntil = state.banUntil + request.bans.memoryMillis
          state.strikes.fill(0)
          outcome = 'banned'
          retryAfterMillis = Math.max(state.banUntil, freeAt) - now
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
        banMillisLeft: outcome === 'banned' ? Math.ceil(state.banUntil - now) : 0,
        banStep,
        newBan,
      }
    },
    async unban(keyId: string, changeId: number, options: UnbanOptions = {}) {
      if (unbansApplied.has(changeId)) return false
      unbansApplied.set(changeId, true)
      const state = states.get(keyId)
      if (!state) return true
      state.banUntil = 0
      state.strikes.fill(0)
      // The lifted ban ends now: the ladder remembers it from here, not from the end it was due.
      const now = options.nowMillis ?? clock()
      state.levelUntil = Math.min(state.levelUntil, now + (options.memoryMillis ?? BAN_MEMORY_MILLIS))
      return true
    },
    async close() {
      states.clear()
      unbansApplied.clear()
    },
  }
}
