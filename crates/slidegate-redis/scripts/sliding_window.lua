-- slidegate sliding_window: a ring of n buckets of width b (bucket i holds
-- the times [i*b, (i+1)*b)), the window (n - 1)*b; the oldest bucket is
-- weighted by the part of it still in the window (interpolated) or whole
-- (conservative). Decides as the core's SlidingWindow::check.
--
-- KEYS[1]  the limited key's hash `<prefix>{<key>}`: field `n` (the newest
--          bucket index, absent for 0) and one field per non-empty bucket of
--          the ring, named by its index i (newest - n < i <= newest, in
--          decimal), holding its count.
-- ARGV[1]  the time in microseconds, or -1 to read the server's TIME.
-- ARGV[2]  the bucket width b = ceil(W / (n - 1)) in microseconds.
-- ARGV[3]  the number of buckets n.
-- ARGV[4]  the limit.
-- ARGV[5]  the weighting: 0 interpolated, 1 conservative.
-- ARGV[6]  the cost, at most limit + 1 (a larger cost decides alike).
-- Answers  allowed (0/1), remaining, reset_at, retry_at or -1, estimate
--          whole, estimate numerator, estimate denominator, now: eight
--          values (no table: the caller copies them into its reply);
--          instants in microseconds, on the clock of ARGV[1].
-- Clock    the server's TIME unless ARGV[1] gives one. `newest` never moves
--          backwards: a request before the newest bucket is judged as at the
--          start of the newest bucket and counted in its own bucket if that
--          is still in the ring, refused otherwise (as the core).
-- Writes   a counted request (its bucket), and any request with a cost whose
--          time moves the ring forward (`n`, and the buckets that left it),
--          as the core's state moves, in one HSET (and one HDEL of the
--          buckets that left the ring); a peek (cost 0) never writes.
--          Through cache.lua (sent before this), which takes the values as
--          numbers and writes them as integers.
-- Expiry   PEXPIRE max(1 s, 2 max((n - 1) b, (newest + n) b - now)) on every
--          write, in this same call.
-- Cost     O(n): the whole ring is read (HGETALL of at most n + 1 fields) and
--          walked once; a refusal scans it for its retry time. Per decision
--          at most TIME (on the server clock), HGETALL, HDEL, HSET, PEXPIRE;
--          in the newest bucket no HDEL.
-- Exact    for integers below 2^53: the products are count * (part of b), at
--          most limit * b <= 2^50, and the instants at most
--          now + n b < 2^53 (see the crate docs for the ranges).

local now = clock(ARGV[1])
local b = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local conservative = ARGV[5] == '1'
local cost = tonumber(ARGV[6])

local own, rem = divmod(now, b)

-- The stored ring: `newest`, then the counts by bucket index, read in one
-- pass.
local flat = redis.call('HGETALL', KEYS[1])
local newest = 0
for i = 1, #flat, 2 do
  if flat[i] == 'n' then
    newest = tonumber(flat[i + 1])
    break
  end
end
-- A request with a cost whose time is after `newest` moves the ring forward
-- before the decision, refused or not: the buckets at or before own - n
-- leave it.
local moves = cost > 0 and own > newest
-- A request in time order with a cost: the core's in-order path.
local in_order = cost > 0 and own >= newest
-- The ring as seen at the decision's bucket: buckets bucket - n < i <=
-- newest (a peek may look ahead of newest: the buckets between are empty).
local bucket, elapsed = own, rem
if own < newest then
  bucket, elapsed = newest, 0
end
-- Buckets outside the ring (after newest, before it by n or more, before
-- 0, or leaving it as it moves) hold nothing; when the ring moves, they
-- are deleted.
local low = newest - n
if moves and own - n > low then
  low = own - n
end
local counts = {}
local stale = {}
local total = 0
local last = nil -- the newest non-empty bucket in view
for i = 1, #flat, 2 do
  local idx = tonumber(flat[i])
  if idx ~= nil then
    if idx > low and idx <= newest then
      local c = tonumber(flat[i + 1])
      counts[idx] = c
      if idx > bucket - n and c > 0 then
        total = total + c
        if last == nil or idx > last then
          last = idx
        end
      end
    elseif moves then
      stale[#stale + 1] = flat[i]
    end
  end
end
if moves then
  newest = own
end
local gap = bucket - newest

local oldest = counts[bucket - n + 1] or 0
local rest = total - oldest
local w = b - elapsed
if conservative then
  w = b
end
local part = oldest * w
local in_ring = bucket - own < n
-- Admitted when rest*b + part + cost*b <= limit*b.
local free = limit - rest
local allowed = in_ring and free >= cost and part <= (free - cost) * b
local after = total
local counted = allowed and cost > 0
if counted then
  counts[own] = (counts[own] or 0) + cost
  after = total + cost
  if last == nil or own > last then
    last = own
  end
end
-- The writes: an HDEL of the buckets that left the ring, then one HSET.
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
if moves and counted then
  redis.call('HSET', KEYS[1], 'n', newest, own, counts[own])
elseif moves then
  redis.call('HSET', KEYS[1], 'n', newest)
elseif counted then
  redis.call('HSET', KEYS[1], own, counts[own])
end
if moves or counted then
  local span = math.max((n - 1) * b, (newest + n) * b - now)
  redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil(2 * span / 1000)))
end

-- remaining = free after the request - ceil(part / b), at least 0.
local q, r = divmod(part, b)
local remaining = 0
if in_ring then
  local f = math.max(free, 0)
  if allowed then
    f = f - cost
  end
  if r > 0 then
    f = f - 1
  end
  remaining = math.max(f - q, 0)
end

local reset_at = 0
if after > 0 and gap < n then
  reset_at = (last + n) * b
end

local retry_at = -1
if not allowed and cost <= limit then
  -- The least e >= e_from (< b) at which cost fits beside `rest` and the
  -- oldest bucket's part, or nil.
  local function fits_at(rest_k, oldest_k, e_from)
    local room = limit - rest_k - cost
    if room < 0 then
      return nil
    end
    room = room * b
    local e
    if oldest_k == 0 then
      e = e_from
    elseif conservative then
      if oldest_k * b <= room then
        e = e_from
      else
        return nil
      end
    else
      -- oldest*(b - e) <= room  <=>  e >= b - floor(room / oldest)
      local qr = divmod(room, oldest_k)
      local least = 0
      if qr < b then
        least = b - qr
      end
      e = math.max(least, e_from)
    end
    if e < b then
      return e
    end
    return nil
  end

  if not in_ring and fits_at(rest, oldest, 0) == 0 then
    -- It fits as judged; it waits for its own bucket to be back in the ring.
    retry_at = (bucket - (n - 1)) * b
  else
    -- At step k the ring has reached bucket + k: its oldest bucket is
    -- bucket - n + 1 + k, the ones before it gone.
    retry_at = (bucket + n) * b
    local rest_k, oldest_k, e_from = rest, oldest, elapsed
    for k = 0, n - 1 do
      if k > 0 then
        oldest_k = counts[bucket - n + 1 + k] or 0
        rest_k = math.max(rest_k - oldest_k, 0)
        e_from = 0
      end
      local e = fits_at(rest_k, oldest_k, e_from)
      if e ~= nil then
        retry_at = (bucket + k) * b + e
        break
      end
    end
  end
end

-- The estimate as the core reports it: rest + part / b on its in-order
-- path, (rest + q) + r / b otherwise.
local whole, num = rest + q, r
if in_order then
  whole, num = rest, part
end
local ok = 0
if allowed then
  ok = 1
end
return ok, remaining, reset_at, retry_at, whole, num, b, now
