/**
 * The whole per-request rate-limit decision as one Lua script: one round trip, atomic across
 * any number of gateways. All state of one API key lives in one string (KEYS[1]), packed with
 * Redis's `struct` library to stay far below 400 bytes:
 *
 *   nM:I2 nD:I2 | minuteHead:d minute[nM]:I4 | dayHead:d day[nD]:I4
 *   | strikes:I4 strikeStart:d | banUntil:d level:I4 levelUntil:d
 *
 * Each window is a ring of n = buckets + 1 counters. `head` is the bucket index (time / bucket)
 * last written. At time t the ring counts the buckets floor(t/b) - buckets … floor(t/b): every
 * request that can lie in the rolling window (t - W, t], and the oldest bucket whole. So no
 * rolling span of W ever holds more than the limit (a request is admitted only if everything it
 * could share a span with, plus itself, fits), and the price is under-admission of at most one
 * bucket at the window's trailing edge.
 *
 * ARGV: nowOverrideMs (0 = Redis TIME), minute limit, window ms, bucket ms, day limit, window ms,
 *       bucket ms, strikes, strike window ms, ban memory ms, ladder ms (comma separated)
 * Returns: { outcome (0 admitted, 1 limited, 2 banned), now ms, minute remaining, minute reset,
 *            day remaining, day reset, retry-after ms, ban step, 1 if this request started the ban }
 */
export const SLIDING_WINDOW_LUA = `
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local mLimit, mWindow, mBucket = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local dLimit, dWindow, dBucket = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local strikeLimit, strikeWindow, banMemory = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])

local mBuckets, dBuckets = math.floor(mWindow / mBucket), math.floor(dWindow / dBucket)
local nM, nD = mBuckets + 1, dBuckets + 1
local format = '<I2I2d' .. string.rep('I4', nM) .. 'd' .. string.rep('I4', nD) .. 'I4ddI4d'

-- The state is worked on in place, as the flat array struct.unpack returns and struct.pack takes
-- (copying it into per-window tables and back cost more than the decision itself):
-- v[1] nM, v[2] nD, v[M] minute head, v[M + 1 .. M + nM] minute ring, v[D] day head,
-- v[D + 1 .. D + nD] day ring, then strikes, strikeStart, banUntil, level, levelUntil from v[T + 1].
local M, D = 3, 4 + nM
local T = D + nD
local size = T + 5
local v
local raw = redis.call('GET', KEYS[1])
if raw and string.len(raw) == struct.size(format) then
  v = { struct.unpack(format, raw) }
  if v[1] ~= nM or v[2] ~= nD then v = nil end
end
if v == nil then
  v = { nM, nD }
  for i = 3, size do v[i] = 0 end
end

-- Moves a ring to the current bucket, zeroing the buckets it skipped; never moves backwards.
local function advance(base, n, current)
  local head = v[base]
  if current <= head then return head end
  if current - head >= n then
    for i = base + 1, base + n do v[i] = 0 end
  else
    for index = head + 1, current do v[base + index % n + 1] = 0 end
  end
  v[base] = current
  return current
end

local mCurrent = advance(M, nM, math.floor(now / mBucket))
local dCurrent = advance(D, nD, math.floor(now / dBucket))

local function total(base, n)
  local sum = 0
  for i = base + 1, base + n do sum = sum + v[i] end
  return sum
end

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

local function resetAt(base, n, buckets, bucket, current)
  for index = current - buckets, current do
    if v[base + index % n + 1] > 0 then return (index + buckets + 1) * bucket end
  end
  return now
end

local outcome, retryAfter, banStep, newBan = 0, 0, 0, 0
local mSum, dSum = total(M, nM), total(D, nD)
local strikes, strikeStart, banUntil, level, levelUntil = v[T + 1], v[T + 2], v[T + 3], v[T + 4], v[T + 5]

if banUntil > now then
  outcome, retryAfter, banStep = 2, banUntil - now, math.max(level - 1, 0)
elseif mSum + 1 <= mLimit and dSum + 1 <= dLimit then
  local mi, di = M + mCurrent % nM + 1, D + dCurrent % nD + 1
  v[mi] = v[mi] + 1
  v[di] = v[di] + 1
  mSum, dSum = mSum + 1, dSum + 1
else
  outcome = 1
  local waitUntil = math.max(
    freedAt(M, nM, mBuckets, mBucket, mCurrent, mSum + 1 - mLimit),
    freedAt(D, nD, dBuckets, dBucket, dCurrent, dSum + 1 - dLimit))
  retryAfter = waitUntil - now
  if now - strikeStart >= strikeWindow then strikes, strikeStart = 0, now end
  strikes = strikes + 1
  if strikes >= strikeLimit then
    local ladder = {}
    for step in string.gmatch(ARGV[11], '[^,]+') do ladder[#ladder + 1] = tonumber(step) end
    if levelUntil <= now then level = 0 end
    banStep = math.min(level, #ladder - 1)
    banUntil = now + ladder[banStep + 1]
    level, levelUntil, strikes = level + 1, now + banMemory, 0
    outcome, retryAfter, newBan = 2, banUntil - now, 1
  end
end

v[T + 1], v[T + 2], v[T + 3], v[T + 4], v[T + 5] = strikes, strikeStart, banUntil, level, levelUntil
local ttl = math.max(dWindow + dBucket, mWindow + mBucket, banUntil - now, levelUntil - now, strikeStart + strikeWindow - now)
redis.call('SET', KEYS[1], struct.pack(format, unpack(v, 1, size)), 'PX', math.ceil(ttl))

return { outcome, now,
  math.max(mLimit - mSum, 0), resetAt(M, nM, mBuckets, mBucket, mCurrent),
  math.max(dLimit - dSum, 0), resetAt(D, nD, dBuckets, dBucket, dCurrent),
  math.ceil(retryAfter), banStep, newBan }
`

/** Unban: clear the ban and strikes, keep the ladder level. KEYS[1] state key. */
export const UNBAN_LUA = `
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local n = string.len(raw)
-- The tail is strikes:I4 strikeStart:d banUntil:d level:I4 levelUntil:d (32 bytes).
local level, levelUntil = struct.unpack('<I4d', raw:sub(n - 11))
local ttl = redis.call('PTTL', KEYS[1])
local packed = raw:sub(1, n - 32) .. struct.pack('<I4ddI4d', 0, 0, 0, level, levelUntil)
if ttl > 0 then redis.call('SET', KEYS[1], packed, 'PX', ttl) else redis.call('SET', KEYS[1], packed) end
return 1
`
