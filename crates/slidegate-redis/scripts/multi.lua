-- slidegate multi: one request on one key against several limits (quotas),
-- all or nothing; or a charge after the fact under every limit.
--
-- Sent after prelude.lua, cache.lua and the per-algorithm scripts, each
-- wrapped by src/lib.rs (`scripts::MULTI`) as a function of its own keys and
-- arguments: `fixed_window(KEYS, ARGV)`, `gcra(KEYS, ARGV)`,
-- `sliding_log(KEYS, ARGV)`, `sliding_window(KEYS, ARGV)`, each answering its
-- eight-integer reply. Defines, once per call, what batch.lua (sent after
-- this) runs for each request:
--
-- `set_now(t)`  the time of the next requests, in microseconds.
-- `decide(shape, costs, out, n)`  decides a request: `shape` its limits
--          (batch.lua's), `costs` its cost for each limit (clamped by the
--          client as each script wants it). Every limit is peeked (cost 0);
--          if each cost fits its peek's remaining, each is charged;
--          otherwise none is: a limit that fits shows its peek, one that
--          does not its refusal at the cost (with its retry). One limit, or
--          cost 0: each decided at the cost at once. The rule of
--          slidegate_store::decide_all, figure for figure. Appends the k
--          replies, eight integers each, to `out` after its `n`-th element;
--          answers the new length.
-- `charge(shape, costs)`  records each cost under its limit even past the
--          limit, as the core's `record` (a time before the state's newest
--          is recorded at the newest, as the scripts judge it), keeping each
--          script's state format and its PEXPIRE rule.

local now = 0

local function set_now(t)
  now = t
end

-- The record of each algorithm: `cost` (> 0) counted whatever the limit.
local function record_fixed_window(keys, w, cost)
  local state = redis.call('HMGET', keys[1], 'w', 'c')
  local win = tonumber(state[1]) or 0
  local count = tonumber(state[2]) or 0
  local idx = divmod(now, w)
  if idx > win then
    win, count = idx, 0
  end
  redis.call('HSET', keys[1], 'w', win, 'c', count + cost)
  redis.call('PEXPIRE', keys[1], math.max(1000, math.ceil(2 * w / 1000)))
end

local function record_gcra(keys, t, limit, cost)
  local tat = tonumber(redis.call('HGET', keys[1], 't')) or 0
  tat = math.max(tat, now) + cost * t
  redis.call('HSET', keys[1], 't', tat)
  local span = math.max(limit * t, tat - now)
  redis.call('PEXPIRE', keys[1], math.max(1000, math.ceil(2 * span / 1000)))
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
    redis.call('HSET', keys[1], 'n', newest)
  end
  if newest - own < n then
    redis.call('HINCRBY', keys[1], own, cost)
  end
  local span = math.max((n - 1) * b, (newest + n) * b - now)
  redis.call('PEXPIRE', keys[1], math.max(1000, math.ceil(2 * span / 1000)))
end

-- The arguments of one algorithm call, reused: the algorithm scripts read
-- their ARGV once, at their start.
local args = {}

-- Limit `q` of a shape decided at `cost` (0 peeks), by its algorithm's script.
local function check(q, cost)
  local kind = q.kind
  args[1] = now
  if kind == 'f' then
    args[2], args[3], args[4] = q.f1, q.f2, cost
    return fixed_window(q.keys, args)
  elseif kind == 'g' then
    args[2], args[3], args[4], args[5] = q.f1, q.f2, q.f3, cost
    return gcra(q.keys, args)
  elseif kind == 'l' then
    args[2], args[3], args[4] = q.f1, q.f2, cost
    return sliding_log(q.keys, args)
  end
  args[2], args[3], args[4], args[5], args[6] = q.f1, q.f2, q.f3, q.f4, cost
  return sliding_window(q.keys, args)
end

local function append(out, n, reply)
  for i = 1, 8 do
    out[n + i] = reply[i]
  end
  return n + 8
end

local function decide(shape, costs, out, n)
  local k = shape.k
  if k == 1 then
    return append(out, n, check(shape[1], costs[1]))
  end
  local replies = {}
  if costs[1] == 0 then
    for j = 1, k do
      replies[j] = check(shape[j], costs[j])
    end
  else
    local all_fit = true
    for j = 1, k do
      replies[j] = check(shape[j], 0)
      if costs[j] > replies[j][2] then
        all_fit = false
      end
    end
    for j = 1, k do
      if all_fit or costs[j] > replies[j][2] then
        replies[j] = check(shape[j], costs[j])
      end
    end
  end
  for j = 1, k do
    n = append(out, n, replies[j])
  end
  return n
end

local function charge(shape, costs)
  for j = 1, shape.k do
    local q, cost = shape[j], costs[j]
    if cost > 0 then
      if q.kind == 'f' then
        record_fixed_window(q.keys, q.f1, cost)
      elseif q.kind == 'g' then
        record_gcra(q.keys, q.f1, q.f3, cost)
      elseif q.kind == 'l' then
        record_sliding_log(q.keys, q.f1, cost)
      else
        record_sliding_window(q.keys, q.f1, q.f2, cost)
      end
    end
  end
end
