-- slidegate sliding_window sync (hybrid mode): adds one instance's counts,
-- made locally since its last sync, to the shared ring of a key, and
-- answers the whole ring. The ring is the one `sliding_window.lua` keeps, so
-- direct and hybrid instances can share a key.
--
-- KEYS[1]  the limited key's hash `<prefix>{<key>}`: field `n` (the newest
--          bucket index, absent for 0) and one field per non-empty bucket of
--          the ring, named by its index i (newest - n < i <= newest, in
--          decimal), holding its count.
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the bucket width b in microseconds.
-- ARGV[3]  the number of buckets n.
-- ARGV[4.. ] pairs: a bucket index and the count to add to it.
-- Reply    {now, newest, i1, c1, i2, c2, ...}: the time, the ring's newest
--          bucket index after the sync, and every non-empty bucket of the
--          ring with its count, indices in microseconds / b.
-- Clock    the server's TIME unless ARGV[1] gives one. The ring moves
--          forward to the bucket of now; it never moves backwards. A count
--          for a bucket after the newest (a client clock a little ahead of
--          the server's) is added to the newest bucket: it happened no later
--          than now. A count for a bucket that has left the ring is dropped:
--          it no longer counts in any window.
-- Writes   the counts added, and `n` and the buckets that left the ring when
--          the ring moves forward; nothing when there is nothing to add and
--          the ring does not move.
-- Expiry   PEXPIRE max(1 s, 2 max((n - 1) b, (newest + n) b - now)) on every
--          write, in this same call (as `sliding_window.lua`).
-- Cost     O(n + pairs): HGETALL, at most one HDEL and one HSET, PEXPIRE.

local now = clock(ARGV[1])
local b = tonumber(ARGV[2])
local n = tonumber(ARGV[3])

local flat = redis.call('HGETALL', KEYS[1])
local newest = 0
for i = 1, #flat, 2 do
  if flat[i] == 'n' then
    newest = tonumber(flat[i + 1])
  end
end
local own = divmod(now, b)
local top = math.max(newest, own)
local counts = {}
local stale = {}
for i = 1, #flat, 2 do
  local idx = tonumber(flat[i])
  if idx ~= nil then
    if idx > top - n and idx <= newest then
      counts[idx] = tonumber(flat[i + 1])
    else
      stale[#stale + 1] = flat[i]
    end
  end
end

local fields = {}
if top > newest then
  fields[#fields + 1] = 'n'
  fields[#fields + 1] = int(top)
end
for i = 4, #ARGV - 1, 2 do
  local idx = math.min(tonumber(ARGV[i]), top)
  local add = tonumber(ARGV[i + 1])
  if idx > top - n and add > 0 then
    counts[idx] = (counts[idx] or 0) + add
    fields[#fields + 1] = int(idx)
    fields[#fields + 1] = int(counts[idx])
  end
end
local wrote = false
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
  wrote = true
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  wrote = true
end
if wrote then
  local span = math.max((n - 1) * b, (top + n) * b - now)
  redis.call('PEXPIRE', KEYS[1], int(math.max(1000, math.ceil(2 * span / 1000))))
end

local reply = {now, top}
for idx, c in pairs(counts) do
  if c > 0 then
    reply[#reply + 1] = idx
    reply[#reply + 1] = c
  end
end
return reply
