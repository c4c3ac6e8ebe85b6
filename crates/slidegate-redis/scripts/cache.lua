-- slidegate's hash cache: within one call of many requests, each hash the
-- algorithm scripts touch is read from Redis once and written back once.
--
-- Sent after prelude.lua and before the algorithm scripts, which call
-- `redis.call` as if alone: the `redis` they see is this file's, whose
-- `call` answers HGET, HMGET, HGETALL, HSET, HDEL, HINCRBY, and PEXPIRE of
-- a hash it holds, from the cache, and passes every other command (TIME,
-- the sliding log's sorted set and string) to Redis. The first command on
-- a hash reads it whole (HGETALL); `flush()` at the end of the call writes
-- the fields set (HSET), deletes the fields deleted (HDEL), and sets the
-- last expiry asked for (PEXPIRE). The script runs atomically, so the
-- state it leaves, and every answer read in between, is what the same
-- commands run one by one would give; a hash touched by many requests
-- costs four Redis commands in all instead of four each. Nothing is
-- written before `flush()`: a call that fails midway leaves every hash as
-- it was. A call whose requests touch each key once does without (batch.lua
-- says so): every command goes straight to Redis.

-- Set by `begin()` at each call's start: as a script, this file runs anew
-- every call; as a Redis function (src/lib.rs `Function`), it ran once,
-- when its library was loaded, and the `redis` it saw then was the
-- loader's (which has no `call`).
local real = nil
local hashes = {}
local touched = {}

-- The cached hash `key`: `fields` (name -> value), the names `set` and
-- `del` since the read, and the last `ttl`. Every value is a number (the
-- algorithms keep integers), and so is every name that reads as one (a
-- sliding window's bucket index): the scripts pass them as numbers, and
-- `tonumber` of a number is cheap where of a string it is not.
local function hash(key)
  local h = hashes[key]
  if h == nil then
    local flat = real.call('HGETALL', key)
    local fields = {}
    for i = 1, #flat, 2 do
      local name = flat[i]
      fields[tonumber(name) or name] = tonumber(flat[i + 1])
    end
    h = { fields = fields, set = {}, del = {}, ttl = nil }
    hashes[key] = h
    touched[#touched + 1] = key
  end
  return h
end

-- The commands the algorithm scripts send, answered as Redis would. They
-- ask at most two fields at once and set at most two; the values set are
-- numbers (Redis 7 writes an integer-valued number as an integer). One
-- function rather than one per command: every function a script defines
-- is made anew on every call.
local caching = false

local function call(command, key, ...)
  if not caching then
    return real.call(command, key, ...)
  end
  local a, b, c, d = ...
  if command == 'HGET' then
    local v = hash(key).fields[a]
    if v == nil then
      return false
    end
    return v
  elseif command == 'HMGET' then
    local fields = hash(key).fields
    local x, y = fields[a], fields[b]
    if x == nil then
      x = false
    end
    if y == nil then
      y = false
    end
    return { x, y }
  elseif command == 'HGETALL' then
    local out, i = {}, 0
    for name, value in pairs(hash(key).fields) do
      out[i + 1], out[i + 2] = name, value
      i = i + 2
    end
    return out
  elseif command == 'HSET' then
    local h = hash(key)
    local fields, set, del = h.fields, h.set, h.del
    local added = 0
    if fields[a] == nil then
      added = 1
    end
    fields[a], set[a], del[a] = b, true, nil
    if c ~= nil then
      if fields[c] == nil then
        added = added + 1
      end
      fields[c], set[c], del[c] = d, true, nil
    end
    return added
  elseif command == 'HINCRBY' then
    local h = hash(key)
    local value = (tonumber(h.fields[a]) or 0) + b
    h.fields[a], h.set[a], h.del[a] = value, true, nil
    return value
  elseif command == 'HDEL' then
    local h = hash(key)
    local gone = 0
    for _, name in ipairs({ ... }) do
      if h.fields[name] ~= nil then
        gone = gone + 1
        h.fields[name], h.set[name], h.del[name] = nil, nil, true
      end
    end
    return gone
  elseif command == 'PEXPIRE' and hashes[key] ~= nil then
    -- A cached hash's expiry waits for `flush()`; any other key's (the
    -- sliding log's) is set now.
    hashes[key].ttl = a
    return 1
  end
  return real.call(command, key, ...)
end

-- A call's start: the server's API, an empty cache, and commands sent
-- straight to Redis until `cache()`.
local function begin()
  real = redis
  hashes, touched, caching = {}, {}, false
end

-- From now on, the hashes are cached (else every command goes to Redis:
-- the call touches no key twice).
local function cache()
  caching = true
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

local redis = { call = call }
