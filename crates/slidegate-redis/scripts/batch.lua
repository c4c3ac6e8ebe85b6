-- slidegate batch: many requests, each on its key against its limits,
-- decided (or charged) one after the other in one call, in the order sent.
--
-- Sent last, after prelude.lua, cache.lua, the algorithm scripts and
-- multi.lua (`set_now`, `decide`, `charge`), all joined by src/lib.rs
-- (`scripts::MULTI`).
--
-- The requests come as shapes (a key's limits: sent once for every request
-- on them) and requests (a shape, a time, the costs):
--
-- ARGV[1]  `1` when some key is in more than one request: the hashes are
--          cached (cache.lua), each read once and written once; `0` when
--          not.
-- ARGV[2]  the number of shapes s; then each shape: its mode (`d` decides,
--          `c` charges), its number of limits k, and five fields per limit:
--          the algorithm (`f` fixed_window, `g` gcra, `l` sliding_log, `w`
--          sliding_window) and its four figures as its own script takes
--          them after `now` (unused ones 0): f: W, limit; g: T, burst,
--          limit; l: W, limit; w: b, n, limit, weighting.
-- KEYS     every shape's keys in the order of the shapes and their limits:
--          one per limit (`<prefix><tag>:{<key>}`), two for sliding_log (its
--          `:log` and `:sum`); all with the hash tag `{<key>}`. On a Redis
--          Cluster all in one slot.
-- then     the number of runs; then each run of m requests alike (the same
--          shape, time and costs, one after the other): its shape (from 1),
--          or when m > 1 its shape negated and m; its time in microseconds
--          (-1 for the server's TIME, read once for the whole call); and its
--          k costs.
-- Reply    every run's replies, one after the other. A run of one request:
--          its reply, 8k integers for a decision, {k} for a charge. A run of
--          m > 1: a header, then
--          -1   each request's reply in order (the general path), or
--          x >= 0 (decisions at a cost > 0, in time order, of limits
--               fixed_window, gcra and sliding_window): the first x
--               requests passed, the others were refused; when x > 0 the
--               first's reply (8k integers) and its step (8k), when x < m
--               the refusal's (8k). The i-th passed (from 0) answers the
--               first's reply plus i steps; every refusal alike.
-- Writes   the hashes once each, at the end (cache.lua's `flush`).

-- Shapes in order, and by their index as sent (a string; negated, in
-- `runs_of`, made when a run of more than one request first needs it:
-- each `tostring` is a `sprintf`), and the numbers read so far
-- by their text: a table lookup costs far less than `tonumber`.
local list = {}
local shapes = {}
local runs_of = nil
local numbers = {}
local function number(text)
  local x = numbers[text]
  if x == nil then
    x = tonumber(text)
    numbers[text] = x
  end
  return x
end

if ARGV[1] == '1' then
  cache()
end
local a, key_at = 3, 1
for s = 1, tonumber(ARGV[2]) do
  local k = tonumber(ARGV[a + 1])
  local shape = { decides = ARGV[a] == 'd', k = k }
  a = a + 2
  for j = 1, k do
    local kind = ARGV[a]
    local q = {
      kind = kind,
      f1 = tonumber(ARGV[a + 1]),
      f2 = tonumber(ARGV[a + 2]),
      f3 = tonumber(ARGV[a + 3]),
      f4 = ARGV[a + 4],
    }
    if kind == 'l' then
      q.keys = { KEYS[key_at], KEYS[key_at + 1] }
      key_at = key_at + 2
    else
      q.keys = { KEYS[key_at] }
      key_at = key_at + 1
    end
    shape[j] = q
    a = a + 5
  end
  list[s] = shape
  shapes[tostring(s)] = shape
end

-- A run of m > 1 decisions of `shape` (limits fixed_window, gcra or
-- sliding_window) at `costs` (each > 0) at one time, with their header
-- slot at out[n + 1]; answers the new length, or nil (the run takes the
-- general path) when its time is before a sliding window's newest bucket.
--
-- The first request is decided in full (it rolls a window, moves a ring,
-- as it would). When it passed, the requests after it see every limit's
-- state as it left it but for their own count (fixed_window: the
-- window's; sliding_window, n >= 2: the newest bucket's, never the
-- oldest, so the oldest's part, q and r stay; gcra: the TAT, c T later
-- each): the i-th after it passes while, under every limit, its c i fits
-- the first's remaining (gcra: the backlog plus c T i fits the burst, and
-- the first's remaining was not cut to the limit), with c i less
-- remaining, c i more estimate whole (gcra: and its TAT, the reset, c T i
-- later). A refusal then writes nothing (in the window, the newest
-- bucket, or a TAT past now), nor does the first when refused on one
-- limit, so the refusals are all alike. So the passes are counted and
-- written at once, and the first refusal decided in full at the state
-- they leave: the figures of deciding each in turn (the tests compare
-- every one with the core's). The general path takes the rest after the
-- first when a gcra remaining is cut, or the first refused on several.
local function run(shape, costs, m, out, n)
  local k = shape.k
  for j = 1, k do
    local q = shape[j]
    if q.kind == 'l' then
      return nil
    elseif q.kind == 'w' then
      local newest = tonumber(redis.call('HGET', q.keys[1], 'n')) or 0
      if divmod(now, q.f1) < newest then
        return nil
      end
    end
  end
  local head = n + 1
  n = decide(shape, costs, out, head)
  local passed = true
  for j = 1, k do
    if out[head + 8 * j - 7] ~= 1 then
      passed = false
    end
  end
  if not passed and k == 1 then
    out[head] = 0
    return n
  end
  -- The passes after the first, and each limit's TAT step.
  local further, steps = m - 1, {}
  for j = 1, k do
    local q, c, reply = shape[j], costs[j], head + 8 * j - 8
    local f, step = 0, 0
    if passed and q.kind == 'g' then
      -- T, burst, limit; the TAT after the first: its reset.
      local t, burst, limit, tat = q.f1, q.f2, q.f3, out[reply + 3]
      local whole, part = divmod(tat - now, t)
      if part > 0 then
        whole = whole + 1
      end
      if burst - whole > limit then
        passed = false
      end
      f, step = divmod(burst * t - (tat - now), c * t), c * t
    elseif passed then
      f = math.floor(out[reply + 2] / c)
    end
    if f < further then
      further = f
    end
    steps[j] = step
  end
  if not passed then
    out[head] = -1
    for _ = 2, m do
      n = decide(shape, costs, out, n)
    end
    return n
  end
  if further > 0 then
    for j = 1, k do
      local q, c = shape[j], costs[j]
      local key = q.keys[1]
      if q.kind == 'g' then
        local t = q.f1
        local tat = out[head + 8 * j - 5] + further * c * t
        redis.call('HSET', key, 't', tat)
        local span = math.max(q.f3 * t, tat - now)
        redis.call('PEXPIRE', key, math.max(1000, math.ceil(2 * span / 1000)))
      elseif q.kind == 'w' then
        redis.call('HINCRBY', key, (divmod(now, q.f1)), further * c)
      else
        redis.call('HINCRBY', key, 'c', further * c)
      end
    end
  end
  for j = 1, k do
    local c = costs[j]
    n = append(out, n, { 0, -c, steps[j], 0, c, 0, 0, 0 })
  end
  if further < m - 1 then
    n = decide(shape, costs, out, n)
  end
  out[head] = further + 1
  return n
end

local server_now = nil
local out, n = {}, 0
local costs = {}
for _ = 1, tonumber(ARGV[a]) do
  local shape = shapes[ARGV[a + 1]]
  local m = 1
  if shape == nil then
    if runs_of == nil then
      runs_of = {}
      for s = 1, #list do
        runs_of[tostring(-s)] = list[s]
      end
    end
    shape = runs_of[ARGV[a + 1]]
    m = number(ARGV[a + 2])
    a = a + 1
  end
  local t = ARGV[a + 2]
  if t == '-1' then
    if server_now == nil then
      server_now = clock(-1)
    end
    t = server_now
  else
    t = number(t)
  end
  set_now(t)
  local k = shape.k
  for j = 1, k do
    costs[j] = number(ARGV[a + 2 + j])
  end
  local done = nil
  if m > 1 then
    if shape.decides and costs[1] > 0 then
      done = run(shape, costs, m, out, n)
    end
    if done == nil then
      n = n + 1
      out[n] = -1
    end
  end
  if done ~= nil then
    n = done
  else
    for _ = 1, m do
      if shape.decides then
        n = decide(shape, costs, out, n)
      else
        charge(shape, costs)
        n = n + 1
        out[n] = k
      end
    end
  end
  a = a + 2 + k
end
flush()
return out
