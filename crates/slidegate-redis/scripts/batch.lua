-- slidegate batch: many requests, each on its key against its limits,
-- decided (or charged) one after the other in one call, in the order sent.
--
-- Sent after prelude.lua, cache.lua, the algorithm scripts and multi.lua
-- (the function `multi(KEYS, ARGV)`: one request), all joined by src/lib.rs
-- (`scripts::MULTI`).
--
-- KEYS     every request's keys, in the order of the requests (multi.lua's
--          KEYS for each). On a Redis Cluster all in one slot.
-- ARGV[1]  the number of requests r.
-- then each request's fields as multi.lua takes them: its time (-1 for the
--          server's TIME, read once for the whole call), its mode, its
--          number of limits k, and six fields per limit.
-- Reply    every request's reply, one after the other: 8k integers for a
--          decision, {k} for a charge.
-- Writes   the hashes once each, at the end (cache.lua's `flush`).

local r = tonumber(ARGV[1])
local server_now = nil
local out = {}
local a, key_at = 2, 1
for _ = 1, r do
  local k = tonumber(ARGV[a + 2])
  local argv = {}
  for j = 1, 3 + 6 * k do
    argv[j] = ARGV[a + j - 1]
  end
  if tonumber(argv[1]) < 0 then
    if server_now == nil then
      server_now = clock(-1)
    end
    argv[1] = server_now
  end
  local keys = {}
  for j = 1, k do
    keys[#keys + 1] = KEYS[key_at]
    key_at = key_at + 1
    if argv[3 + (j - 1) * 6 + 1] == 'l' then
      keys[#keys + 1] = KEYS[key_at]
      key_at = key_at + 1
    end
  end
  for _, x in ipairs(multi(keys, argv)) do
    out[#out + 1] = x
  end
  a = a + 3 + 6 * k
end
flush()
return out
