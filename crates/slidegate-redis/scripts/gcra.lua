-- slidegate gcra: the generic cell rate algorithm (virtual scheduling).
--
-- KEYS[1]  the limited key's hash `<prefix>{<key>}`; field `t` (the
--          theoretical arrival time TAT, microseconds).
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the emission interval T = ceil(W / limit) in microseconds.
-- ARGV[3]  the burst.
-- ARGV[4]  the limit.
-- ARGV[5]  the cost, at most min(burst, limit) + 1 (a larger cost decides
--          alike).
-- Answers  allowed (0/1), remaining, reset_at, retry_at or -1, estimate
--          whole, estimate numerator, estimate denominator, now: eight
--          values (no table: the caller copies them into its reply);
--          instants in microseconds, on the clock of ARGV[1].
-- Clock    the server's TIME unless ARGV[1] gives one. A time before TAT
--          only makes the backlog TAT - now larger: nothing moves back.
-- Expiry   PEXPIRE max(1 s, 2 max(limit T, TAT - now)) on every write, in this
--          same call.
-- Exact    for integers below 2^53: every figure stays below it.
-- Helpers  clock, divmod and int come from prelude.lua, sent before this.
-- Writes   through cache.lua (sent before this), which takes the values as
--          numbers and writes them as integers.

local now = clock(ARGV[1])
local t = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])

local tat = tonumber(redis.call('HGET', KEYS[1], 't')) or 0
local most = math.min(burst, limit)
local cap = burst * t
local base = math.max(tat, now)
local backlog = base - now
local allowed = cost <= most and backlog + cost * t <= cap
if allowed and cost > 0 then
  tat = base + cost * t
  redis.call('HSET', KEYS[1], 't', tat)
  local span = math.max(limit * t, tat - now)
  redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil(2 * span / 1000)))
end
local q, r = divmod(math.max(tat, now) - now, t)
if r > 0 then
  q = q + 1
end
local remaining = math.min(math.max(burst - q, 0), limit)
local retry_at = -1
if not allowed and cost <= most then
  retry_at = math.max(base + cost * t - cap, 0)
end
local whole, part = divmod(backlog, t)
local ok = 0
if allowed then
  ok = 1
end
return ok, remaining, tat, retry_at, whole, part, t, now
