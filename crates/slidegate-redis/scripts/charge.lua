-- slidegate charge: a charge after the fact under every limit of a request
-- (`scripts::MULTI` only; sent after decide.lua, whose `now` it reads).
--
-- `charge(shape, costs)`  records each cost under its limit even past the
--          limit, as the core's `record` (a time before the state's newest
--          is recorded at the newest, as the scripts judge it), keeping each
--          script's state format and its PEXPIRE rule.

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
