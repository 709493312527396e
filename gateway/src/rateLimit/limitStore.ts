/**
 * The rate-limit store: ban check, both sliding windows and strike counting as one atomic step
 * per request. Two implementations share these semantics and one conformance suite: Redis
 * (one Lua script, one round trip) and an in-process store for the single-process default.
 */
export interface WindowSpec {
  /** Requests allowed in any rolling span of `windowMillis`. */
  limit: number
  windowMillis: number
  /** Resolution: the window is `windowMillis / bucketMillis` buckets plus the current one. */
  bucketMillis: number
}

export interface BanPolicy {
  /** Limited requests within a rolling minute window (the minute window's length and buckets) that trigger a ban. */
  strikes: number
  /** Ban lengths; each new ban while the previous is remembered climbs one step. */
  ladderMillis: number[]
  /** How long after a ban ends it is remembered for climbing the ladder (24 h). */
  memoryMillis: number
}

export interface LimitRequest {
  /** API key id; never the key. */
  keyId: string
  minute: WindowSpec
  day: WindowSpec
  bans: BanPolicy
  /** Tests only: a fixed store time in ms. Production leaves it unset and the store reads its own clock (Redis TIME). */
  nowMillis?: number
  /** The key's plan, for what onLateDecision reports. */
  plan?: string
  /**
   * Called with the decision the store applied after the caller had stopped waiting for it (a
   * Redis reply later than the time budget, the request answered per onStoreFailure meanwhile).
   * Not a closure per request: the request is passed back, with when the call was made on this
   * process's monotonic clock (performance.now()): whatever the store did, it did after that.
   */
  onLateDecision?: (request: LimitRequest, decision: LimitDecision, calledAt: number) => void
}

export interface WindowState {
  limit: number
  /** Requests still allowed now; never negative. */
  remaining: number
  /** Store time (ms) when the oldest counted request leaves the window. */
  resetMillis: number
}

export type LimitOutcome = 'admitted' | 'limited' | 'banned'

export interface LimitDecision {
  outcome: LimitOutcome
  /** The store's clock at the decision, in ms. */
  nowMillis: number
  minute: WindowState
  day: WindowState
  /**
   * For limited and banned: ms until a request would really be admitted. For a ban, the later of
   * its end and the moment both windows let a request in again.
   */
  retryAfterMillis: number
  /** For banned: ms until the ban itself ends (how long it is answered without a store call). */
  banMillisLeft: number
  /** For banned: the ladder step (0-based) of the ban in force. */
  banStep: number
  /** True when this very request's strike started the ban. */
  newBan: boolean
}

export interface LimitStore {
  readonly kind: 'redis' | 'memory'
  consume(request: LimitRequest): Promise<LimitDecision>
  /**
   * What fails together for this key: a Redis Cluster master (its `host:port`), or the whole
   * store. One failed master must not set the others' keys aside.
   */
  failureDomain?(keyId: string): string
  /**
   * False once a failure domain holds none of the keys (a Cluster master whose slots a failover
   * or a reshard gave to another): its failure is over for every key it held.
   */
  holdsKeys?(domain: string): boolean
  /**
   * Lifts a ban and clears strikes; the ladder step reached is kept, and the lifted ban, which
   * ends now, is remembered for climbing it for `memoryMillis` from now, as a ban that ended on
   * its own would be (not from the end it was due). Once per unban: every
   * gateway applies the same unban (`changeId`, its entry in the key change log), and a lift
   * arriving after the key earned a new ban would lift that one too. Resolves false when this
   * unban was applied already (by this store or, for Redis, another gateway) and nothing changed.
   */
  unban(keyId: string, changeId: number, options?: UnbanOptions): Promise<boolean>
  close(): Promise<void>
}

export interface UnbanOptions {
  /** Tests only: a fixed store time in ms. Production leaves it unset and the store reads its own clock (Redis TIME). */
  nowMillis?: number
  /** How long the lifted ban is remembered for climbing the ladder (BanPolicy.memoryMillis; 24 h unless given). */
  memoryMillis?: number
}

/** Every Redis key of one API key shares this hash tag, so one Cluster slot holds them all. */
export function limitKey(keyId: string): string {
  return `rl:{${keyId}}`
}

/** Marks one unban of a key applied: beside the key's state, in its Cluster slot. */
export function unbanAppliedKey(keyId: string, changeId: number): string {
  return `${limitKey(keyId)}:unban:${changeId}`
}

/** How long an applied unban is remembered: as long as gateways retry a pending one (a day). */
export const UNBAN_APPLIED_MILLIS = 86_400_000
