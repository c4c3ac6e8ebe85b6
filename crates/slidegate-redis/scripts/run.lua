-- slidegate run: a run of m requests alike (one key, one shape, one time,
-- one cost), decided one after the other; the whole call in `scripts::ONE`
-- (one.lua), each run of a call in `scripts::MULTI` (batch.lua).
--
-- Sent after decide.lua (`decide`, `append`, `now`); a run of charges is
-- batch.lua's own.
--
-- `decide_run(shape, costs, m, out, n)`  appends the run's reply to `out`
--          after its `n`-th element (batch.lua's first comment: for m = 1
--          the request's 8k integers; for m > 1 a header, -1 then each
--          reply, or x >= 0 then the first's reply, its step and the
--          refusal); answers the new length.

-- A run of m > 1 decisions of `shape` (limits fixed_window, gcra or
-- sliding_window) at `costs` (each > 0) at one time, with their header
-- slot at out[n + 1]; answers the new length, or nil (the run takes the
-- general path) for a sliding_log.
--
-- The first request is decided in full (it rolls a window, moves a ring,
-- as it would). When it passed, the requests after it see every limit's
-- state as it left it but for their own count (fixed_window: the
-- window's; sliding_window, n >= 2: the newest bucket's, never the
-- oldest, so the oldest's part, q and r stay, or, at a time before the
-- newest bucket, its own bucket's, judged at the newest's start where the
-- oldest weighs whole, so a count anywhere in the ring takes as much off
-- the remaining and adds as much to the estimate whole; gcra: the TAT,
-- c T later each): the i-th after it passes while, under every limit,
-- its c i fits
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
    if shape[j].kind == 'l' then
      return nil
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
    n = append(out, n, 0, -c, steps[j], 0, c, 0, 0, 0)
  end
  if further < m - 1 then
    n = decide(shape, costs, out, n)
  end
  out[head] = further + 1
  return n
end

-- The run's reply: in closed form when it can be (`run`), else each request
-- in turn behind the header -1.
local function decide_run(shape, costs, m, out, n)
  if m == 1 then
    return decide(shape, costs, out, n)
  end
  if costs[1] > 0 then
    local done = run(shape, costs, m, out, n)
    if done ~= nil then
      return done
    end
  end
  n = n + 1
  out[n] = -1
  for _ = 1, m do
    n = decide(shape, costs, out, n)
  end
  return n
end
