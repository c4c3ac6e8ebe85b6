-- slidegate lease sync (the hybrid mode's bounded form): adds one
-- instance's counts, spent locally since its last sync from its lease, to
-- the shared ring of a key, and grants it a new lease: a share of what the
-- key has left that it may spend without asking, until the lease expires.
--
-- One call syncs a batch of keys (all on one server; on a Cluster, all in
-- one hash slot).
--
-- KEYS     each key's lease hash `<prefix>{<key>}:...:lease` (its own: the
--          direct scripts do not know leases, so they never share it):
--          field `n` (the newest bucket index, absent for 0), one field
--          per non-empty bucket of the ring, named by its index i
--          (newest - n < i <= newest, in decimal), holding its count, and
--          one field `L<instance>` per instance holding a lease (or that
--          asked for one), `<units>:<expiry in µs>`.
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the bucket width b in microseconds (a fixed window: its length).
-- ARGV[3]  the number of buckets n (a fixed window: 1).
-- ARGV[4]  the limit.
-- ARGV[5]  the instance's id.
-- ARGV[6]  the lease time in microseconds.
-- ARGV[7..] per key, in the order of KEYS: carry (the units of its lease
--          the instance has not spent and may still spend before it hears
--          this reply; 0 if it gives its lease back), want (the units it
--          asks for beyond the carry), m, then m pairs: a bucket index and
--          the units spent in it.
-- Reply    per key, in the order of KEYS: the number of values that follow,
--          then {now, newest, grant, i1, c1, i2, c2, ...}: the time, the
--          ring's newest bucket after the sync, the units granted beyond
--          the carry, and every non-empty bucket of the ring with its
--          count.
-- Bound    every unit admitted is in the ring or in a lease. A grant never
--          takes the ring's whole count (every bucket of the ring, as the
--          conservative weighting counts them), the other instances' live
--          leases and the carry past the limit, so no window, sliding or
--          fixed, holds more than the limit (a charge after the fact
--          aside). The grant is at most an equal share of what is left
--          among the instances holding a lease (at least 1 unit while any
--          is left), so a lone busy instance gets all of it.
-- Expiry   a lease of another instance whose time has passed is counted as
--          spent whole, in the bucket of its expiry (it may have been
--          spent and never reported: an instance that died), and removed.
--          An instance stops spending a lease once its time has passed on
--          its own clock, counted from before it sent the sync.
-- Clock    as `sliding_window_sync.lua`: the ring moves forward to the
--          bucket of now, never back; a count for a bucket after the newest
--          goes to the newest, one for a bucket that left the ring is
--          dropped.
-- Expiry   PEXPIRE max(1 s, 2 max(n b, lease time)) on every call.
-- Cost     per key O(n + leases + pairs): HGETALL, at most one HDEL and
--          one HSET, PEXPIRE.

local now = clock(ARGV[1])
local b = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local me = 'L' .. ARGV[5]
local ttl = tonumber(ARGV[6])

-- One key's sync: its spent pairs are ARGV[first .. last].
local function sync(key, carry, want, first, last)
  local flat = redis.call('HGETALL', key)
  local newest = 0
  for i = 1, #flat, 2 do
    if flat[i] == 'n' then
      newest = tonumber(flat[i + 1])
    end
  end
  local own = divmod(now, b)
  local top = math.max(newest, own)
  local counts = {}
  local changed = {}
  local gone = {}
  local leases = {}
  for i = 1, #flat, 2 do
    local field = flat[i]
    if string.sub(field, 1, 1) == 'L' then
      local units, expiry = string.match(flat[i + 1], '^(%d+):(%d+)$')
      if field == me or units == nil then
        gone[#gone + 1] = field
      else
        leases[field] = {tonumber(units), tonumber(expiry)}
      end
    elseif field ~= 'n' then
      local idx = tonumber(field)
      if idx ~= nil and idx > top - n and idx <= newest then
        counts[idx] = tonumber(flat[i + 1])
      else
        gone[#gone + 1] = field
      end
    end
  end

  local function add(idx, units)
    idx = math.min(idx, top)
    if idx > top - n and units > 0 then
      counts[idx] = (counts[idx] or 0) + units
      changed[idx] = true
    end
  end

  local held, others = 0, 0
  for field, lease in pairs(leases) do
    if lease[2] <= now then
      add(divmod(lease[2], b), lease[1])
      gone[#gone + 1] = field
    else
      held = held + lease[1]
      others = others + 1
    end
  end
  for i = first, last - 1, 2 do
    add(tonumber(ARGV[i]), tonumber(ARGV[i + 1]))
  end

  local used = 0
  for _, c in pairs(counts) do
    used = used + c
  end
  local free = limit - used - held - carry
  local grant = 0
  if want > 0 and free > 0 then
    grant = math.min(want, free, math.max(1, math.floor(free / (others + 1))))
  end

  local fields = {}
  if top > newest then
    fields[#fields + 1] = 'n'
    fields[#fields + 1] = int(top)
  end
  for idx, _ in pairs(changed) do
    fields[#fields + 1] = int(idx)
    fields[#fields + 1] = int(counts[idx])
  end
  if carry + grant > 0 or want > 0 then
    fields[#fields + 1] = me
    fields[#fields + 1] = int(carry + grant) .. ':' .. int(now + ttl)
  end
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
  if #fields > 0 then
    redis.call('HSET', key, unpack(fields))
  end
  local span = math.max(n * b, ttl)
  redis.call('PEXPIRE', key, int(math.max(1000, math.ceil(2 * span / 1000))))

  local reply = {now, top, grant}
  for idx, c in pairs(counts) do
    if c > 0 then
      reply[#reply + 1] = idx
      reply[#reply + 1] = c
    end
  end
  return reply
end

local out = {}
local at = 7
for k = 1, #KEYS do
  local carry, want, m = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local first = at + 3
  local reply = sync(KEYS[k], carry, want, first, first + 2 * m - 1)
  out[#out + 1] = #reply
  for _, v in ipairs(reply) do
    out[#out + 1] = v
  end
  at = first + 2 * m
end
return out
