-- slidegate sliding_log: the exact log of admitted requests over (now - W, now].
--
-- KEYS[1]  the limited key's log, a sorted set `<prefix>{<key>}:log`: one
--          member `<time>:<cost>` with score `<time>` (microseconds) per
--          distinct admitted time, the costs of one time summed.
-- KEYS[2]  the sum of the costs in the log, a string `<prefix>{<key>}:sum`
--          (the same hash tag): kept with the log, so that a decision reads
--          only the entries that leave the window, not the whole log. When
--          it is missing beside a log, it is recomputed from the log.
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the window W in microseconds.
-- ARGV[3]  the limit.
-- ARGV[4]  the cost, at most limit + 1 (a larger cost decides alike).
-- Answers  allowed (0/1), remaining, reset_at, retry_at or -1, estimate
--          whole, estimate numerator, estimate denominator, now: eight
--          values (no table: the caller copies them into its reply);
--          instants in microseconds, on the clock of ARGV[1].
-- Clock    the server's TIME unless ARGV[1] gives one. A time before the
--          newest entry is judged and logged at the newest entry's time
--          (clamped): the log stays sorted and never under-counts.
-- Writes   an admitted request (its entry and the sum), and a request with
--          a cost that finds entries gone from the window (they are removed
--          and the sum lowered); a peek (cost 0) never writes.
-- Expiry   PEXPIRE of the log and SET ... PX of the sum, both
--          max(1 s, 2 max(W, newest + W - now)), on every write, in this
--          same call.
-- Cost     O(log n + k) per decision, k the entries that leave the window
--          (amortised O(1): each entry leaves once), plus, on a refusal,
--          the entries it must wait for (usually one).
-- Exact    for integers below 2^53: every figure stays below it.
-- Helpers  clock, divmod and int come from prelude.lua, sent before this.

local now = clock(ARGV[1])
local w = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

-- The cost of a member `<time>:<cost>`.
local function cost_of(m)
  return tonumber(string.match(m, ':(%d+)$'))
end

local t = now
local newest, newest_member = nil, nil
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last > 0 then
  newest_member, newest = last[1], tonumber(last[2])
  if newest > t then
    t = newest
  end
end
-- An entry at s counts while s > t - W.
local cutoff = t - w

local sum = redis.call('GET', KEYS[2])
if newest == nil then
  -- No log: nothing counts, whatever a stray sum says.
  sum = 0
elseif sum then
  sum = tonumber(sum)
else
  -- A log without its sum: summed once, then kept.
  sum = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    sum = sum + cost_of(m)
  end
end

local wrote = false
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(cutoff))
local live = sum
for _, m in ipairs(gone) do
  live = live - cost_of(m)
end
if cost > 0 and #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(cutoff))
  wrote = true
end
if newest ~= nil and newest <= cutoff then
  -- The newest entry left the window too: the log is empty.
  newest, newest_member = nil, nil
end

local allowed = live + cost <= limit
local after = live
if allowed and cost > 0 then
  if newest == t then
    redis.call('ZREM', KEYS[1], newest_member)
    redis.call('ZADD', KEYS[1], int(t), int(t) .. ':' .. int(cost_of(newest_member) + cost))
  else
    redis.call('ZADD', KEYS[1], int(t), int(t) .. ':' .. int(cost))
  end
  newest = t
  after = live + cost
  wrote = true
end
if wrote then
  local span = w
  if newest ~= nil then
    span = math.max(w, newest + w - now)
  end
  local ttl = int(math.max(1000, math.ceil(2 * span / 1000)))
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('SET', KEYS[2], int(after), 'PX', ttl)
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
  local offset = 0
  while left + cost > limit do
    local batch = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(cutoff), '+inf', 'LIMIT', offset, 16)
    if #batch == 0 then
      break
    end
    for _, m in ipairs(batch) do
      if left + cost <= limit then
        break
      end
      left = left - cost_of(m)
      retry_at = tonumber(string.match(m, '^(%d+):')) + w
    end
    offset = offset + #batch
  end
end
local ok = 0
if allowed then
  ok = 1
end
return ok, math.max(0, limit - after), reset_at, retry_at, live, 0, 1, now
