-- slidegate's hash cache: within one call of many requests, each hash the
-- algorithm scripts touch is read from Redis once and written back once.
--
-- Sent after prelude.lua and before the algorithm scripts, which call
-- `redis.call` as if alone: the `redis` they see is this table, which
-- answers HGET, HMGET, HGETALL, HSET, HDEL, HINCRBY, and PEXPIRE of a hash
-- it holds, from the cache, and passes every other command (TIME, the
-- sliding log's sorted set and string) to Redis. The first command on a hash reads it whole
-- (HGETALL); `flush()` at the end of the call writes the fields set
-- (HSET), deletes the fields deleted (HDEL), and sets the last expiry asked
-- for (PEXPIRE). The script runs atomically, so the state it leaves, and
-- every answer read in between, is what the same commands run one by one
-- would give; a hash touched by many requests costs four Redis commands in
-- all instead of four each. Nothing is written before `flush()`: a call
-- that fails midway leaves every hash as it was.

local real = redis
local hashes = {}
local touched = {}

-- The cached hash `key`: `fields` (name -> value, as Redis keeps them:
-- strings), the names `set` and `del` since the read, and the last `ttl`.
local function hash(key)
  local h = hashes[key]
  if h == nil then
    local flat = real.call('HGETALL', key)
    local fields = {}
    for i = 1, #flat, 2 do
      fields[flat[i]] = flat[i + 1]
    end
    h = { fields = fields, set = {}, del = {}, ttl = nil }
    hashes[key] = h
    touched[#touched + 1] = key
  end
  return h
end

local function put(h, name, value)
  h.fields[name] = value
  h.set[name] = true
  h.del[name] = nil
end

local cached = {}

function cached.HGET(key, name)
  local v = hash(key).fields[name]
  if v == nil then
    return false
  end
  return v
end

function cached.HMGET(key, ...)
  local h = hash(key)
  local out = {}
  for i, name in ipairs({ ... }) do
    local v = h.fields[name]
    if v == nil then
      v = false
    end
    out[i] = v
  end
  return out
end

function cached.HGETALL(key)
  local out = {}
  for name, value in pairs(hash(key).fields) do
    out[#out + 1] = name
    out[#out + 1] = value
  end
  return out
end

function cached.HSET(key, ...)
  local h = hash(key)
  local args = { ... }
  local added = 0
  for i = 1, #args, 2 do
    local name = tostring(args[i])
    if h.fields[name] == nil then
      added = added + 1
    end
    put(h, name, tostring(args[i + 1]))
  end
  return added
end

function cached.HDEL(key, ...)
  local h = hash(key)
  local gone = 0
  for _, name in ipairs({ ... }) do
    name = tostring(name)
    if h.fields[name] ~= nil then
      gone = gone + 1
      h.fields[name] = nil
      h.set[name] = nil
      h.del[name] = true
    end
  end
  return gone
end

function cached.HINCRBY(key, name, by)
  local h = hash(key)
  name = tostring(name)
  local value = (tonumber(h.fields[name]) or 0) + tonumber(by)
  put(h, name, int(value))
  return value
end

-- The expiry of a cached hash waits for `flush()`; any other key's (the
-- sliding log's) is set now.
function cached.PEXPIRE(key, ms)
  local h = hashes[key]
  if h == nil then
    return real.call('PEXPIRE', key, ms)
  end
  h.ttl = ms
  return 1
end

-- Writes every touched hash back: its deleted fields, its set fields, its
-- last expiry.
local function flush()
  for _, key in ipairs(touched) do
    local h = hashes[key]
    local del = {}
    for name in pairs(h.del) do
      del[#del + 1] = name
    end
    if #del > 0 then
      real.call('HDEL', key, unpack(del))
    end
    local set = {}
    for name in pairs(h.set) do
      set[#set + 1] = name
      set[#set + 1] = h.fields[name]
    end
    if #set > 0 then
      real.call('HSET', key, unpack(set))
    end
    if h.ttl ~= nil then
      real.call('PEXPIRE', key, h.ttl)
    end
  end
end

local redis = setmetatable({
  call = function(command, key, ...)
    local f = cached[command]
    if f ~= nil then
      return f(key, ...)
    end
    return real.call(command, key, ...)
  end,
}, { __index = real })
