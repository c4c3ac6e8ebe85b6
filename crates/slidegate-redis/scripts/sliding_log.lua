-- slidegate sliding_log: the exact log of admitted requests over (now - W, now].
--
-- KEYS[1]  the limited key's log, a sorted set `<prefix>{<key>}:log`: one
--          member `<time>:<cost>` with score `<time>` (microseconds) per
--          distinct admitted time, the costs of one time summed.
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the window W in microseconds.
-- ARGV[3]  the limit.
-- ARGV[4]  the cost, at most limit + 1 (a larger cost decides alike).
-- Reply    {allowed (0/1), remaining, reset_at, retry_at or -1,
--           estimate whole, estimate numerator, estimate denominator, now};
--          instants in microseconds, on the clock of ARGV[1].
-- Clock    the server's TIME unless ARGV[1] gives one. A time before the
--          newest entry is judged and logged at the newest entry's time
--          (clamped): the log stays sorted and never under-counts.
-- Expiry   PEXPIRE max(1 s, 2 max(W, newest + W - now)) on every write, in
--          this same call.
-- Cost     O(entries in the window), at most `limit` entries: for small
--          limits.
-- Exact    for integers below 2^53: every figure stays below it.
-- Helpers  clock, divmod and int come from prelude.lua, sent before this.

local now = clock(ARGV[1])
local w = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

local t = now
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last > 0 and tonumber(last[2]) > t then
  t = tonumber(last[2])
end
-- An entry at s counts while s > t - W.
local cutoff = t - w
if cost > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(cutoff))
end
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(cutoff), '+inf')
local times, costs = {}, {}
local live = 0
for i, m in ipairs(members) do
  local s, c = string.match(m, '^(%d+):(%d+)$')
  times[i], costs[i] = tonumber(s), tonumber(c)
  live = live + costs[i]
end
local n = #members
local allowed = live + cost <= limit
local newest = nil
if n > 0 then
  newest = times[n]
end
if allowed and cost > 0 then
  if newest == t then
    redis.call('ZREM', KEYS[1], members[n])
    redis.call('ZADD', KEYS[1], int(t), int(t) .. ':' .. int(costs[n] + cost))
  else
    redis.call('ZADD', KEYS[1], int(t), int(t) .. ':' .. int(cost))
  end
  newest = t
  local span = math.max(w, newest + w - now)
  redis.call('PEXPIRE', KEYS[1], int(math.max(1000, math.ceil(2 * span / 1000))))
end
local after = live
if allowed then
  after = live + cost
end
local reset_at = 0
if after > 0 then
  reset_at = newest + w
end
local retry_at = -1
if not allowed and cost <= limit then
  -- Free the oldest entries until the request fits.
  local left = live
  retry_at = t
  for i = 1, n do
    if left + cost <= limit then
      break
    end
    left = left - costs[i]
    retry_at = times[i] + w
  end
end
local ok = 0
if allowed then
  ok = 1
end
return {ok, math.max(0, limit - after), reset_at, retry_at, live, 0, 1, now}
