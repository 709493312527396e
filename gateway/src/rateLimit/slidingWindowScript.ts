/**
 * The whole per-request rate-limit decision as one Lua script: one round trip, atomic across
 * any number of gateways. All state of one API key lives in one string (KEYS[1]), packed with
 * Redis's `struct` library to stay far below 400 bytes:
 *
 *   nM:I2 nD:I2 minuteBucket:I4 dayBucket:I4 banUntil:d level:I4 levelUntil:d
 *   | minuteHead:d minute[nM]:I4 strikes[nM]:I4 | dayHead:d day[nD]:I4
 *
 * Each window is a ring of n = buckets + 1 counters. `head` is the bucket index (time / bucket)
 * last written. At time t the ring counts the buckets floor(t/b) - buckets … floor(t/b): every
 * request that can lie in the rolling window (t - W, t], and the oldest bucket whole. So no
 * rolling span of W ever holds more than the limit (a request is admitted only if everything it
 * could share a span with, plus itself, fits), and the price is under-admission of at most one
 * bucket at the window's trailing edge. Strikes (requests that arrive while limited) are counted
 * the same way in a ring beside the minute's: `strikes` of them within a rolling minute ban the
 * key, wherever the minute's boundaries fall.
 *
 * A state kept under other window settings (a reload changed a bucket or a length, or another
 * gateway still runs the old config) is carried over, not dropped: each old bucket's requests
 * are counted in the new bucket that holds the old bucket's last moment, so none of them leaves
 * the window sooner than it would have, and the ban, its ladder step and the strikes stay.
 *
 * ARGV: nowOverrideMs (0 = Redis TIME), minute limit, window ms, bucket ms, day limit, window ms,
 *       bucket ms, strikes, ban memory ms, ladder ms (comma separated), deadline ms in Redis time
 *       (0 = none: past it the script changes nothing and answers outcome 3, see redisStore.ts)
 * Returns: { outcome (0 admitted, 1 limited, 2 banned, 3 expired), now ms, minute remaining, minute reset,
 *            day remaining, day reset, retry-after ms, ban step, 1 if this request started the ban,
 *            ms left of the ban in force }
 */
/** The struct format of a state with n1 minute and n2 day buckets (the layout above), for both scripts. */
const STATE_LAYOUT_LUA = `local function layout(n1, n2)
  return '<I2I2I4I4dI4dd' .. string.rep('I4', 2 * n1) .. 'd' .. string.rep('I4', n2)
end`

export const SLIDING_WINDOW_LUA = `
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local deadline = tonumber(ARGV[11]) or 0
if deadline > 0 and now > deadline then return { 3, now, 0, 0, 0, 0, 0, 0, 0, 0 } end
local mLimit, mWindow, mBucket = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local dLimit, dWindow, dBucket = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local strikeLimit, banMemory = tonumber(ARGV[8]), tonumber(ARGV[9])

local mBuckets, dBuckets = math.floor(mWindow / mBucket), math.floor(dWindow / dBucket)
local nM, nD = mBuckets + 1, dBuckets + 1
${STATE_LAYOUT_LUA}
local format = layout(nM, nD)

-- The state is worked on in place, as the flat array struct.unpack returns and struct.pack takes
-- (copying it into per-window tables and back cost more than the decision itself):
-- v[1] nM, v[2] nD, v[3] minute bucket, v[4] day bucket, v[5] banUntil, v[6] level, v[7] levelUntil,
-- v[M] minute head, v[M + 1 .. M + nM] minute ring, v[S + 1 .. S + nM] strike ring (the minute's
-- head serves both), v[D] day head, v[D + 1 .. D + nD] day ring.
local M = 8
local S = M + nM
local D = S + nM + 1
local size = D + nD
local v

-- A state written under other window settings, or in the layout before the bucket lengths were
-- kept (strikes:I4 strikeStart:d banUntil:d level:I4 levelUntil:d at the end, buckets as now).
local function stored(raw)
  local n1, n2 = struct.unpack('<I2I2', raw)
  local length = string.len(raw)
  if length == struct.size(layout(n1, n2)) then
    local o = { struct.unpack(layout(n1, n2), raw) }
    return { o = o, nM = n1, nD = n2, mBucket = o[3], dBucket = o[4], banUntil = o[5], level = o[6], levelUntil = o[7],
      mAt = 8, sAt = 8 + n1, dAt = 9 + 2 * n1 }
  end
  local legacy = '<I2I2d' .. string.rep('I4', n1) .. 'd' .. string.rep('I4', n2) .. 'I4ddI4d'
  if length == struct.size(legacy) then
    local o = { struct.unpack(legacy, raw) }
    local t = 4 + n1 + n2
    return { o = o, nM = n1, nD = n2, mBucket = mBucket, dBucket = dBucket, banUntil = o[t + 3], level = o[t + 4],
      levelUntil = o[t + 5], mAt = 3, dAt = 4 + n1, strikes = o[t + 1], strikeStart = o[t + 2] }
  end
  return nil
end

-- Adds an old ring's requests to ring \`base\`, each in the new bucket holding its old bucket's last moment.
local function carry(o, oBase, oN, oBucket, oHead, base, n, bucket, current)
  for index = oHead - oN + 1, oHead do
    local count = o[oBase + index % oN + 1]
    if count > 0 then
      local at = math.min(math.floor(((index + 1) * oBucket - 1) / bucket), current)
      if at > current - n then
        local i = base + at % n + 1
        v[i] = v[i] + count
      end
    end
  end
end

local raw = redis.call('GET', KEYS[1])
if raw and string.len(raw) == struct.size(format) then
  v = { struct.unpack(format, raw) }
  if v[1] ~= nM or v[2] ~= nD or v[3] ~= mBucket or v[4] ~= dBucket then v = nil end
end
if v == nil then
  local old = raw and string.len(raw) >= 4 and stored(raw) or nil
  v = { nM, nD, mBucket, dBucket }
  for i = 5, size do v[i] = 0 end
  if old then
    local o = old.o
    v[5], v[6], v[7] = old.banUntil, old.level, old.levelUntil
    v[M], v[D] = math.floor(now / mBucket), math.floor(now / dBucket)
    carry(o, old.mAt, old.nM, old.mBucket, o[old.mAt], M, nM, mBucket, v[M])
    if old.sAt then carry(o, old.sAt, old.nM, old.mBucket, o[old.mAt], S, nM, mBucket, v[M]) end
    -- The old layout kept one strike count since its first strike: counted now, while that minute lasts.
    if old.strikes and now - old.strikeStart < mWindow then v[S + v[M] % nM + 1] = old.strikes end
    carry(o, old.dAt, old.nD, old.dBucket, o[old.dAt], D, nD, dBucket, v[D])
  end
end

local function total(base, n)
  local sum = 0
  for i = base + 1, base + n do sum = sum + v[i] end
  return sum
end

-- Moves a ring (and the ring paired with it) to the current bucket, zeroing the buckets it
-- skipped. A head ahead of the clock by less than a window stays (the clock went back a little);
-- one ahead by more (Redis's clock jumped back) keeps its requests, all counted as of now.
local function advance(base, n, current, paired)
  local head = v[base]
  if current <= head then
    if head - current < n then return head end
    for _, ring in ipairs(paired and { base, paired } or { base }) do
      local sum = total(ring, n)
      for i = ring + 1, ring + n do v[i] = 0 end
      v[ring + current % n + 1] = sum
    end
  elseif current - head >= n then
    for i = base + 1, base + n do v[i] = 0 end
    if paired then for i = paired + 1, paired + n do v[i] = 0 end end
  else
    for index = head + 1, current do
      local slot = index % n + 1
      v[base + slot] = 0
      if paired then v[paired + slot] = 0 end
    end
  end
  v[base] = current
  return current
end

local mCurrent = advance(M, nM, math.floor(now / mBucket), S)
local dCurrent = advance(D, nD, math.floor(now / dBucket))

-- Time when enough of the oldest buckets have left the window to let \`need\` requests in.
local function freedAt(base, n, buckets, bucket, current, need)
  if need <= 0 then return now end
  local freed = 0
  for index = current - buckets, current do
    freed = freed + v[base + index % n + 1]
    if freed >= need then return (index + buckets + 1) * bucket end
  end
  return (current + buckets + 1) * bucket
end

-- When the oldest counted request leaves; for a spent window, when a request would be admitted
-- again (later than that when a lowered limit left the window holding more than it).
local function resetAt(base, n, buckets, bucket, current, sum, limit)
  if sum >= limit then return freedAt(base, n, buckets, bucket, current, sum + 1 - limit) end
  for index = current - buckets, current do
    if v[base + index % n + 1] > 0 then return (index + buckets + 1) * bucket end
  end
  return now
end

local outcome, retryAfter, banStep, newBan = 0, 0, 0, 0
local mSum, dSum = total(M, nM), total(D, nD)
local banUntil, level, levelUntil = v[5], v[6], v[7]

-- When both windows would let one more request in (a ban's Retry-After is never earlier).
local function windowsFreeAt()
  return math.max(
    freedAt(M, nM, mBuckets, mBucket, mCurrent, mSum + 1 - mLimit),
    freedAt(D, nD, dBuckets, dBucket, dCurrent, dSum + 1 - dLimit))
end

if banUntil > now then
  outcome, retryAfter, banStep = 2, math.max(banUntil, windowsFreeAt()) - now, math.max(level - 1, 0)
elseif mSum + 1 <= mLimit and dSum + 1 <= dLimit then
  local mi, di = M + mCurrent % nM + 1, D + dCurrent % nD + 1
  v[mi] = v[mi] + 1
  v[di] = v[di] + 1
  mSum, dSum = mSum + 1, dSum + 1
else
  outcome = 1
  local freeAt = windowsFreeAt()
  retryAfter = freeAt - now
  local si = S + mCurrent % nM + 1
  v[si] = v[si] + 1
  if total(S, nM) >= strikeLimit then
    local ladder = {}
    for step in string.gmatch(ARGV[10], '[^,]+') do ladder[#ladder + 1] = tonumber(step) end
    if levelUntil <= now then level = 0 end
    banStep = math.min(level, #ladder - 1)
    banUntil = now + ladder[banStep + 1]
    -- The next ban climbs if it comes within the memory of this one's end.
    level, levelUntil = level + 1, banUntil + banMemory
    for i = S + 1, S + nM do v[i] = 0 end
    outcome, retryAfter, newBan = 2, math.max(banUntil, freeAt) - now, 1
  end
end

v[5], v[6], v[7] = banUntil, level, levelUntil
local ttl = math.max(dWindow + dBucket, mWindow + mBucket, banUntil - now, levelUntil - now)
redis.call('SET', KEYS[1], struct.pack(format, unpack(v, 1, size)), 'PX', math.ceil(ttl))

return { outcome, now,
  math.max(mLimit - mSum, 0), resetAt(M, nM, mBuckets, mBucket, mCurrent, mSum, mLimit),
  math.max(dLimit - dSum, 0), resetAt(D, nD, dBuckets, dBucket, dCurrent, dSum, dLimit),
  math.ceil(retryAfter), banStep, newBan, outcome == 2 and math.ceil(banUntil - now) or 0 }
`

/**
 * The applied mark's value while a gateway lifts the ban in two steps (the key's slot migrating
 * between masters): whether the lift has happened is not known yet. Kept for UNBAN_PENDING_MILLIS
 * at most, so a gateway that failed between the steps leaves the unban to the next to try it.
 */
export const UNBAN_PENDING = 'pending'
export const UNBAN_PENDING_MILLIS = 10_000

/**
 * The unban's lift alone, on the state key only (KEYS[1]; ARGV as UNBAN_LUA's, ARGV[1] unused):
 * while a Redis Cluster slot migrates, a script on two keys is refused (TRYAGAIN) until the
 * migration ends, unless both are on the same node, and one on a single key is redirected (ASK).
 */
export const UNBAN_STATE_LUA = unbanStateLua()

/**
 * Unban: clear the ban and the strikes, keep the ladder level. The lifted ban ends now, so the
 * ladder remembers it for the ban memory from now, as one that ended on its own (not from the end
 * it was due: a 24 h ban lifted at once would climb the ladder for 48 h). KEYS[1] state key,
 * KEYS[2] the unban's applied mark (same hash tag), ARGV[1] how long the mark is kept (ms),
 * ARGV[2] nowOverrideMs (0 = Redis TIME), ARGV[3] the ban memory (ms; absent: the level's end
 * is left as it is, as gateways of the previous version call it). An unban already
 * marked returns -1 and changes nothing: the ban in force now is one the key earned since. Reads
 * the layout from the state's own header (nM, nD), so it needs no window settings; a state still
 * in the layout before bucket lengths were kept has its 32-byte tail edited as that layout had it.
 * An unban a gateway is applying in steps (UNBAN_PENDING) returns -2 and changes nothing: it is
 * not known yet whether its lift happened, and the caller waits for the mark to say so.
 */
export const UNBAN_LUA = `
if redis.call('GET', KEYS[2]) == '${UNBAN_PENDING}' then return -2 end
if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', ARGV[1]) then return -1 end
${unbanStateLua()}`

function unbanStateLua(): string {
  return `local raw = redis.call('GET', KEYS[1])
if not raw or string.len(raw) < 4 then return 0 end
local now, memory = tonumber(ARGV[2]) or 0, tonumber(ARGV[3])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function remembered(levelUntil)
  if memory then return math.min(levelUntil, now + memory) end
  return levelUntil
end
local nM, nD = struct.unpack('<I2I2', raw)
${STATE_LAYOUT_LUA}
local format = layout(nM, nD)
local n = string.len(raw)
local packed
if n == struct.size(format) then
  local v = { struct.unpack(format, raw) }
  v[5] = 0
  v[7] = remembered(v[7])
  for i = 9 + nM, 8 + 2 * nM do v[i] = 0 end
  packed = struct.pack(format, unpack(v, 1, 9 + 2 * nM + nD))
else
  local level, levelUntil = struct.unpack('<I4d', raw:sub(n - 11))
  packed = raw:sub(1, n - 32) .. struct.pack('<I4ddI4d', 0, 0, 0, level, remembered(levelUntil))
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('SET', KEYS[1], packed, 'PX', ttl) else redis.call('SET', KEYS[1], packed) end
return 1
`
}
