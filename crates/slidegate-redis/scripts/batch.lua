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
--          m, its time in microseconds (-1 for the server's TIME, read once
--          for the whole call), and its k costs.
-- Reply    every run's replies, one after the other. A run of one request:
--          its reply, 8k integers for a decision, {k} for a charge. A run of
--          m > 1: a header, then
--          -1   each request's reply in order (the general path), or
--          x >= 0 (a decision of one fixed_window, gcra or sliding_window
--               limit at a cost c > 0, in time order): the first x
--               requests passed, the others were refused; when x > 0 the
--               first's reply (8 integers) and its step (8), when x < m the
--               refusal's (8). The i-th passed (from 0) answers the first's
--               reply plus i steps; every refusal alike.
-- Writes   the hashes once each, at the end (cache.lua's `flush`).

-- Shapes by their index as sent (a string), and the numbers read so far
-- by their text: a table lookup costs far less than `tonumber`.
local shapes = {}
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
  shapes[tostring(s)] = shape
end

-- A run of m > 1 decisions of limit `q` at cost c > 0 at one time, with
-- their header slot at out[n + 1]; answers the new length, or nil (the
-- run takes the general path) when its time is before a sliding window's
-- newest bucket. The first request is decided in full (it rolls the
-- window, moves the ring, as it would); after it, while they pass, the
-- requests see the same state but for their own count (fixed_window: the
-- window's; sliding_window, n >= 2: the newest bucket's, never the
-- oldest, so the oldest's part, q and r stay; gcra: the TAT, c T later
-- each), so the i-th has c i less room, c i less remaining, c i more
-- estimate whole (gcra: and its TAT, the reset, c T i later): it passes
-- while c i <= the first's remaining (gcra: while the backlog fits the
-- burst, and the first's remaining was not cut to the limit). A refusal
-- writes nothing in the window or newest bucket (or at a TAT past now),
-- so every one after the first is alike. So the passes are counted and
-- written at once, and the first refusal decided in full at the state
-- they leave: the same figures as deciding each in turn (the tests
-- compare every one with the core's). When the first's remaining is cut
-- (gcra), the others take the general path after it.
local function run(q, c, m, out, n)
  local kind, key = q.kind, q.keys[1]
  local field = 'c'
  if kind == 'w' then
    local own = divmod(now, q.f1)
    local newest = tonumber(redis.call('HGET', key, 'n')) or 0
    if own < newest then
      return nil
    end
    field = own
  end
  local head = n + 1
  local first = check(q, c)
  n = append(out, head, first)
  local x = 0
  if first[1] == 1 then
    local step = 0
    if kind == 'g' then
      -- T, burst, limit; the TAT after the first: first[3].
      local t, burst, limit = q.f1, q.f2, q.f3
      local tat = first[3]
      local qb, rb = divmod(tat - now, t)
      if rb > 0 then
        qb = qb + 1
      end
      if burst - qb > limit then
        -- Its remaining is cut to the limit: each in turn.
        out[head] = -1
        for _ = 2, m do
          n = append(out, n, check(q, c))
        end
        return n
      end
      x = 1 + math.min(m - 1, (divmod(burst * t - (tat - now), c * t)))
      step = c * t
      if x > 1 then
        tat = tat + (x - 1) * step
        redis.call('HSET', key, 't', tat)
        local span = math.max(limit * t, tat - now)
        redis.call('PEXPIRE', key, math.max(1000, math.ceil(2 * span / 1000)))
      end
    else
      x = 1 + math.min(m - 1, math.floor(first[2] / c))
      if x > 1 then
        redis.call('HINCRBY', key, field, (x - 1) * c)
      end
    end
    n = append(out, n, { 0, -c, step, 0, c, 0, 0, 0 })
    if x < m then
      n = append(out, n, check(q, c))
    end
  end
  out[head] = x
  return n
end

local server_now = nil
local out, n = {}, 0
local costs = {}
for _ = 1, tonumber(ARGV[a]) do
  local shape = shapes[ARGV[a + 1]]
  local m = number(ARGV[a + 2])
  local t = ARGV[a + 3]
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
    costs[j] = number(ARGV[a + 3 + j])
  end
  local done = nil
  if m > 1 then
    local q = shape[1]
    if shape.decides and k == 1 and costs[1] > 0 and q.kind ~= 'l' then
      done = run(q, costs[1], m, out, n)
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
  a = a + 3 + k
end
flush()
return out
