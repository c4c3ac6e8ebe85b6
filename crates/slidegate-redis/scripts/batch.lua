-- slidegate batch: many requests, each on its key against its limits,
-- decided (or charged) one after the other in one call, in the order sent.
--
-- Sent last, after prelude.lua, cache.lua, the algorithm scripts,
-- decide.lua (`set_now`, `decide`), charge.lua (`charge`) and run.lua
-- (`decide_run`), all joined by src/lib.rs (`scripts::MULTI`).
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
-- Reply    every run's replies, one after the other, packed as one string
--          (decide.lua's `packed`). A run of one request:
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
--
-- As a Redis function (src/lib.rs `Function`), this file is the function's
-- body and the others ran once, when the library was loaded: what they
-- keep from call to call is set anew by each (cache.lua's `begin`,
-- decide.lua's `set_now`) or scratch (decide.lua's `args`).

-- Shapes in order, and the numbers read so far by their text: a table
-- lookup costs far less than `tonumber` (a run's shape index, and the
-- shapes' figures: a call over many keys of one limit sends the same
-- figures for each key).
local list = {}
local numbers = {}
local function number(text)
  local x = numbers[text]
  if x == nil then
    x = tonumber(text)
    numbers[text] = x
  end
  return x
end

begin()
if ARGV[1] == '1' then
  cache()
end
local a, key_at = 3, 1
for s = 1, tonumber(ARGV[2]) do
  local k = number(ARGV[a + 1])
  local shape = { decides = ARGV[a] == 'd', k = k }
  a = a + 2
  for j = 1, k do
    local kind = ARGV[a]
    local q = {
      kind = kind,
      f1 = number(ARGV[a + 1]),
      f2 = number(ARGV[a + 2]),
      f3 = number(ARGV[a + 3]),
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
end

local server_now = nil
local out, n = {}, 0
local costs = {}
for _ = 1, tonumber(ARGV[a]) do
  local s, m = number(ARGV[a + 1]), 1
  if s < 0 then
    s, m = -s, number(ARGV[a + 2])
    a = a + 1
  end
  local shape = list[s]
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
  if shape.decides then
    n = decide_run(shape, costs, m, out, n)
  else
    if m > 1 then
      n = n + 1
      out[n] = -1
    end
    for _ = 1, m do
      charge(shape, costs)
      n = n + 1
      out[n] = k
    end
  end
  a = a + 2 + k
end
flush()
return packed(out, n)
