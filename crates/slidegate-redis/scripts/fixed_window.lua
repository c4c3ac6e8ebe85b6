-- slidegate fixed_window: one counter per fixed window [k*W, (k+1)*W).
--
-- KEYS[1]  the limited key's hash `<prefix>{<key>}`; fields `w` (the window
--          index k) and `c` (its count).
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the window W in microseconds.
-- ARGV[3]  the limit.
-- ARGV[4]  the cost, at most limit + 1 (a larger cost decides alike).
-- Answers  allowed (0/1), remaining, reset_at, retry_at or -1, estimate
--          whole, estimate numerator, estimate denominator, now: eight
--          values (no table: the caller copies them into its reply);
--          instants in microseconds, on the clock of ARGV[1].
-- Clock    the server's TIME unless ARGV[1] gives one. A time before the
--          stored window is judged in the stored window (clamped): the
--          window never moves backwards.
-- Expiry   PEXPIRE max(1 s, 2 W) on every write, in this same call.
-- Exact    for integers below 2^53: every figure stays below it.
-- Helpers  clock, divmod and int come from prelude.lua, sent before this.
-- Writes   through cache.lua (sent before this), which takes the values as
--          numbers and writes them as integers.

local now = clock(ARGV[1])
local w = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

local state = redis.call('HMGET', KEYS[1], 'w', 'c')
local win = tonumber(state[1]) or 0
local count = tonumber(state[2]) or 0

local idx = divmod(now, w)
if idx < win then
  idx = win
end
local rolled = false
if cost > 0 and idx > win then
  win, count, rolled = idx, 0, true
end
local used = count
if idx > win then
  used = 0
end
local allowed = used + cost <= limit
if allowed and cost > 0 then
  count = used + cost
end
if cost > 0 and (allowed or rolled) then
  redis.call('HSET', KEYS[1], 'w', win, 'c', count)
  redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil(2 * w / 1000)))
end
local after = used
if allowed then
  after = used + cost
end
local reset_at = 0
if after > 0 then
  reset_at = (idx + 1) * w
end
local retry_at = -1
if not allowed and cost <= limit then
  retry_at = (idx + 1) * w
end
local ok = 0
if allowed then
  ok = 1
end
return ok, math.max(0, limit - after), reset_at, retry_at, used, 0, 1, now
