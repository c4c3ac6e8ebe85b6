-- slidegate multi: one request on one key against several limits (quotas),
-- all or nothing, in one call; or a charge after the fact under every limit.
--
-- Sent after prelude.lua, cache.lua and the per-algorithm scripts, each
-- wrapped by src/lib.rs (`scripts::MULTI`) as a function of its own keys and
-- arguments: `fixed_window(KEYS, ARGV)`, `gcra(KEYS, ARGV)`,
-- `sliding_log(KEYS, ARGV)`, `sliding_window(KEYS, ARGV)`, each answering its
-- eight-integer reply; this file is itself wrapped as `multi(KEYS, ARGV)`,
-- which batch.lua calls once per request.
--
-- KEYS     every quota's state in the order of the quotas: one key each
--          (`<prefix><tag>:{<key>}`), two for sliding_log (its `:log` and
--          `:sum`); all with the hash tag `{<key>}`, so one cluster slot.
-- ARGV[1]  the time in microseconds (batch.lua has read the server's TIME
--          for -1): every quota is decided at the same instant.
-- ARGV[2]  the mode: `d` decides, `c` charges.
-- ARGV[3]  the number of quotas k.
-- then six fields per quota: the algorithm (`f` fixed_window, `g` gcra,
--          `l` sliding_log, `w` sliding_window), the cost for this quota
--          (clamped by the client as each script wants it), and the
--          algorithm's four figures as its own script takes them after
--          `now` (unused ones 0): f: W, limit; g: T, burst, limit;
--          l: W, limit; w: b, n, limit, weighting.
-- Decide   every quota is peeked (cost 0); if the cost fits every peek's
--          remaining, each is charged; otherwise none is: a quota that fits
--          shows its peek, one that does not its refusal at the cost (with
--          its retry). One quota, or cost 0: each decided at the cost at
--          once. The rule of slidegate_store::decide_all, figure for figure.
--          Reply: the k replies, eight integers each, one after the other.
-- Charge   records the cost under every quota even past its limit, as the
--          core's `record` (a time before the state's newest is recorded
--          at the newest, as the scripts judge it), keeping each script's
--          state format and its PEXPIRE rule. Reply: {k}.

local now = clock(ARGV[1])
local mode = ARGV[2]
local k = tonumber(ARGV[3])

-- The record of each algorithm: `cost` (> 0) counted whatever the limit.
local function record_fixed_window(keys, w, cost)
  local state = redis.call('HMGET', keys[1], 'w', 'c')
  local win = tonumber(state[1]) or 0
  local count = tonumber(state[2]) or 0
  local idx = divmod(now, w)
  if idx > win then
    win, count = idx, 0
  end
  redis.call('HSET', keys[1], 'w', int(win), 'c', int(count + cost))
  redis.call('PEXPIRE', keys[1], int(math.max(1000, math.ceil(2 * w / 1000))))
end

local function record_gcra(keys, t, limit, cost)
  local tat = tonumber(redis.call('HGET', keys[1], 't')) or 0
  tat = math.max(tat, now) + cost * t
  redis.call('HSET', keys[1], 't', int(tat))
  local span = math.max(limit * t, tat - now)
  redis.call('PEXPIRE', keys[1], int(math.max(1000, math.ceil(2 * span / 1000))))
end

local function record_sliding_log(keys, w, cost)
  local function cost_of(m)
    return tonumber(string.match(m, ':(%d+)$'))
  end
  local t = now
  local newest, newest_member = nil, nil
  local last = redis.call('ZRANGE', keys[1], -1, -1, 'WITHSCORES')
  if #last > 0 then
    newest_member, newest = last[1], tonumber(last[2])
    if newest > t then
      t = newest
    end
  end
  local cutoff = t - w
  local sum = 0
  local stored = redis.call('GET', keys[2])
  if newest ~= nil and stored then
    sum = tonumber(stored)
  elseif newest ~= nil then
    for _, m in ipairs(redis.call('ZRANGE', keys[1], 0, -1)) do
      sum = sum + cost_of(m)
    end
  end
  local gone = redis.call('ZRANGEBYSCORE', keys[1], '-inf', int(cutoff))
  for _, m in ipairs(gone) do
    sum = sum - cost_of(m)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', int(cutoff))
  end
  if newest ~= nil and newest == t and newest > cutoff then
    redis.call('ZREM', keys[1], newest_member)
    redis.call('ZADD', keys[1], int(t), int(t) .. ':' .. int(cost_of(newest_member) + cost))
  else
    redis.call('ZADD', keys[1], int(t), int(t) .. ':' .. int(cost))
  end
  local ttl = int(math.max(1000, math.ceil(2 * math.max(w, t + w - now) / 1000)))
  redis.call('PEXPIRE', keys[1], ttl)
  redis.call('SET', keys[2], int(sum + cost), 'PX', ttl)
end

local function record_sliding_window(keys, b, n, cost)
  local own = divmod(now, b)
  local flat = redis.call('HGETALL', keys[1])
  local newest = 0
  for i = 1, #flat, 2 do
    if flat[i] == 'n' then
      newest = tonumber(flat[i + 1])
      break
    end
  end
  if own > newest then
    -- The ring moves forward: the buckets at or before own - n leave it.
    local stale = {}
    for i = 1, #flat, 2 do
      local idx = tonumber(flat[i])
      if idx ~= nil and idx <= own - n then
        stale[#stale + 1] = flat[i]
      end
    end
    if #stale > 0 then
      redis.call('HDEL', keys[1], unpack(stale))
    end
    newest = own
    redis.call('HSET', keys[1], 'n', int(newest))
  end
  if newest - own < n then
    redis.call('HINCRBY', keys[1], int(own), int(cost))
  end
  local span = math.max((n - 1) * b, (newest + n) * b - now)
  redis.call('PEXPIRE', keys[1], int(math.max(1000, math.ceil(2 * span / 1000))))
end

-- The quotas: their keys, algorithm, cost and figures.
local quotas = {}
local next_key = 1
for j = 1, k do
  local base = 3 + (j - 1) * 6
  local q = {
    kind = ARGV[base + 1],
    cost = tonumber(ARGV[base + 2]),
    f = { ARGV[base + 3], ARGV[base + 4], ARGV[base + 5], ARGV[base + 6] },
  }
  if q.kind == 'l' then
    q.keys = { KEYS[next_key], KEYS[next_key + 1] }
    next_key = next_key + 2
  else
    q.keys = { KEYS[next_key] }
    next_key = next_key + 1
  end
  quotas[j] = q
end

if mode == 'c' then
  for j = 1, k do
    local q = quotas[j]
    local f = q.f
    if q.cost > 0 then
      if q.kind == 'f' then
        record_fixed_window(q.keys, tonumber(f[1]), q.cost)
      elseif q.kind == 'g' then
        record_gcra(q.keys, tonumber(f[1]), tonumber(f[3]), q.cost)
      elseif q.kind == 'l' then
        record_sliding_log(q.keys, tonumber(f[1]), q.cost)
      else
        record_sliding_window(q.keys, tonumber(f[1]), tonumber(f[2]), q.cost)
      end
    end
  end
  return { k }
end

-- Quota j's decision at `cost` (0 peeks), by its algorithm's script.
local function check(j, cost)
  local q = quotas[j]
  local f = q.f
  if q.kind == 'f' then
    return fixed_window(q.keys, { now, f[1], f[2], cost })
  elseif q.kind == 'g' then
    return gcra(q.keys, { now, f[1], f[2], f[3], cost })
  elseif q.kind == 'l' then
    return sliding_log(q.keys, { now, f[1], f[2], cost })
  end
  return sliding_window(q.keys, { now, f[1], f[2], f[3], f[4], cost })
end

local replies = {}
if k == 1 or quotas[1].cost == 0 then
  for j = 1, k do
    replies[j] = check(j, quotas[j].cost)
  end
else
  local all_fit = true
  for j = 1, k do
    replies[j] = check(j, 0)
    if quotas[j].cost > replies[j][2] then
      all_fit = false
    end
  end
  for j = 1, k do
    if all_fit or quotas[j].cost > replies[j][2] then
      replies[j] = check(j, quotas[j].cost)
    end
  end
end
local out = {}
for j = 1, k do
  for i = 1, 8 do
    out[#out + 1] = replies[j][i]
  end
end
return out
