-- slidegate decide: one request on one key against several limits (quotas),
-- all or nothing.
--
-- Sent after prelude.lua (and, in `scripts::MULTI`, cache.lua) and the
-- per-algorithm scripts, each wrapped by src/lib.rs as a function of its
-- own keys and arguments: `fixed_window(KEYS, ARGV)`, `gcra(KEYS, ARGV)`,
-- `sliding_log(KEYS, ARGV)` (nil in `scripts::ONE`, which never asks it),
-- `sliding_window(KEYS, ARGV)`, each answering its eight integers.
-- Defines, once per call, what run.lua and the scripts' last parts
-- (batch.lua, one.lua) run for each request:
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
-- `packed(out, n)`  the call's reply: `out`'s n integers as one string of
--          little-endian 64-bit integers (read by src/store.rs `Packed`).

local now = 0

local function set_now(t)
  now = t
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

-- A reply's eight integers, after `out`'s `n`-th element: the new length.
local function append(out, n, a, b, c, d, e, f, g, h)
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = a, b, c, d
  out[n + 5], out[n + 6], out[n + 7], out[n + 8] = e, f, g, h
  return n + 8
end

-- The call's reply as one string: the client reads it without parsing
-- each integer (about 9,000 instructions fewer for one decision's eight),
-- and Redis packs it for about what it would spend writing an array of
-- numbers. Packed 64 at a time, so that `unpack` stays far below Lua's
-- limit on the arguments of a call (8,000).
local function packed(out, n)
  if n == 8 then
    -- One decision: its format written out, not built.
    return struct.pack('<i8i8i8i8i8i8i8i8', unpack(out, 1, 8))
  elseif n <= 64 then
    return struct.pack('<' .. string.rep('i8', n), unpack(out, 1, n))
  end
  local parts = {}
  for i = 1, n, 64 do
    local j = math.min(n, i + 63)
    parts[#parts + 1] = struct.pack('<' .. string.rep('i8', j - i + 1), unpack(out, i, j))
  end
  return table.concat(parts)
end

local function decide(shape, costs, out, n)
  local k = shape.k
  if k == 1 then
    return append(out, n, check(shape[1], costs[1]))
  end
  local replies = {}
  if costs[1] == 0 then
    for j = 1, k do
      replies[j] = { check(shape[j], costs[j]) }
    end
  else
    local all_fit = true
    for j = 1, k do
      replies[j] = { check(shape[j], 0) }
      if costs[j] > replies[j][2] then
        all_fit = false
      end
    end
    for j = 1, k do
      if all_fit or costs[j] > replies[j][2] then
        replies[j] = { check(shape[j], costs[j]) }
      end
    end
  end
  for j = 1, k do
    n = append(out, n, unpack(replies[j]))
  end
  return n
end
