-- slidegate fixed_window sync (hybrid mode): adds one instance's counts,
-- made locally since its last sync, to the shared counter of a key, and
-- answers the current window and its count. The hash is the one
-- `fixed_window.lua` keeps, so direct and hybrid instances can share a key.
--
-- KEYS[1]  the limited key's hash `<prefix>{<key>}`: fields `w` (the window
--          index k) and `c` (its count).
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the window W in microseconds.
-- ARGV[3.. ] pairs: a window index and the count to add to it.
-- Reply    {now, k, k, c} with c the count of window k, the current one
--          (the later of the stored window and the window of now), or
--          {now, k} when it counts nothing: the shape of
--          `sliding_window_sync.lua`'s reply for a ring of one bucket.
-- Clock    the server's TIME unless ARGV[1] gives one. The window never
--          moves backwards. A count for a window after the current one (a
--          client clock a little ahead of the server's) is added to the
--          current window: it happened no later than now. A count for an
--          earlier window is dropped: it no longer counts.
-- Writes   `w` and `c` when a count is added (the window moved forward
--          first if it has to); nothing when there is nothing to add.
-- Expiry   PEXPIRE max(1 s, 2 W) on every write, in this same call (as
--          `fixed_window.lua`).
-- Exact    for integers below 2^53: every figure stays below it.

local now = clock(ARGV[1])
local w = tonumber(ARGV[2])

local state = redis.call('HMGET', KEYS[1], 'w', 'c')
local win = tonumber(state[1]) or 0
local count = tonumber(state[2]) or 0

-- divmod answers two values: only the quotient is the window of now.
local idx = divmod(now, w)
local top = math.max(win, idx)
if top > win then
  count = 0
end
local added = 0
for i = 3, #ARGV - 1, 2 do
  local idx = math.min(tonumber(ARGV[i]), top)
  if idx == top then
    added = added + tonumber(ARGV[i + 1])
  end
end
if added > 0 then
  count = count + added
  redis.call('HSET', KEYS[1], 'w', int(top), 'c', int(count))
  redis.call('PEXPIRE', KEYS[1], int(math.max(1000, math.ceil(2 * w / 1000))))
end

if count > 0 then
  return {now, top, top, count}
end
return {now, top}
