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
local ladder = {}
for step in string.gmatch(ARGV[11], '[^,]+') do ladder[#ladder + 1] = tonumber(step) end

local mBuckets, dBuckets = math.floor(mWindow / mBucket), math.floor(dWindow / dBucket)
local nM, nD = mBuckets + 1, dBuckets + 1
local format = '<I2I2d' .. string.rep('I4', nM) .. 'd' .. string.rep('I4', nD) .. 'I4ddI4d'

local m, d = {}, {}
local mHead, dHead = 0, 0
local strikes, strikeStart, banUntil, level, levelUntil = 0, 0, 0, 0, 0
local raw = redis.call('GET', KEYS[1])
if raw and string.len(raw) == struct.size(format) then
  local v = { struct.unpack(format, raw) }
  if v[1] == nM and v[2] == nD then
    mHead = v[3]
    for i = 1, nM do m[i] = v[3 + i] end
    dHead = v[4 + nM]
    for i = 1, nD do d[i] = v[4 + nM + i] end
    local o = 4 + nM + nD
    strikes, strikeStart, banUntil, level, levelUntil = v[o + 1], v[o + 2], v[o + 3], v[o + 4], v[o + 5]
  end
end
for i = 1, nM do m[i] = m[i] or 0 end
for i = 1, nD do d[i] = d[i] or 0 end

-- Moves a ring to the current bucket, zeroing the buckets it skipped; never moves backwards.
local function advance(ring, n, head, current)
  if current <= head then return head end
  if current - head >= n then
    for i = 1, n do ring[i] = 0 end
  else
    for index = head + 1, current do ring[index % n + 1] = 0 end
  end
  return current
end

local mCurrent = advance(m, nM, mHead, math.floor(now / mBucket))
local dCurrent = advance(d, nD, dHead, math.floor(now / dBucket))

local function total(ring, n)
  local sum = 0
  for i = 1, n do sum = sum + ring[i] end
  return sum
end

-- Time when enough of the oldest buckets have left the window to let \`need\` requests in.
local function freedAt(ring, n, buckets, bucket, current, need)
  if need <= 0 then return now end
  local freed = 0
  for index = current - buckets, current do
    freed = freed + ring[index % n + 1]
    if freed >= need then return (index + buckets + 1) * bucket end
  end
  return (current + buckets + 1) * bucket
end

local function resetAt(ring, n, buckets, bucket, current)
  for index = current - buckets, current do
    if ring[index % n + 1] > 0 then return (index + buckets + 1) * bucket end
  end
  return now
end

local outcome, retryAfter, banStep, newBan = 0, 0, 0, 0
local mSum, dSum = total(m, nM), total(d, nD)

if banUntil > now then
  outcome, retryAfter, banStep = 2, banUntil - now, math.max(level - 1, 0)
elseif mSum + 1 <= mLimit and dSum + 1 <= dLimit then
  local mi, di = mCurrent % nM + 1, dCurrent % nD + 1
  m[mi] = m[mi] + 1
  d[di] = d[di] + 1
  mSum, dSum = mSum + 1, dSum + 1
else
  outcome = 1
  local waitUntil = math.max(
    freedAt(m, nM, mBuckets, mBucket, mCurrent, mSum + 1 - mLimit),
    freedAt(d, nD, dBuckets, dBucket, dCurrent, dSum + 1 - dLimit))
  retryAfter = waitUntil - now
  if now - strikeStart >= strikeWindow then strikes, strikeStart = 0, now end
  strikes = strikes + 1
  if strikes >= strikeLimit then
    if levelUntil <= now then level = 0 end
    banStep = math.min(level, #ladder - 1)
    banUntil = now + ladder[banStep + 1]
    level, levelUntil, strikes = level + 1, now + banMemory, 0
    outcome, retryAfter, newBan = 2, banUntil - now, 1
  end
end

local values = { nM, nD, mCurrent }
for i = 1, nM do values[#values + 1] = m[i] end
values[#values + 1] = dCurrent
for i = 1, nD do values[#values + 1] = d[i] end
for _, value in ipairs({ strikes, strikeStart, banUntil, level, levelUntil }) do values[#values + 1] = value end
local packed = struct.pack(format, unpack(values))
local ttl = math.max(dWindow + dBucket, mWindow + mBucket, banUntil - now, levelUntil - now, strikeStart + strikeWindow - now)
redis.call('SET', KEYS[1], packed, 'PX', math.ceil(ttl))

return { outcome, now,
  math.max(mLimit - mSum, 0), resetAt(m, nM, mBuckets, mBucket, mCurrent),
  math.max(dLimit - dSum, 0), resetAt(d, nD, dBuckets, dBucket, dCurrent),
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
