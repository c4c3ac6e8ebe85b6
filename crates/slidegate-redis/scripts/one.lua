-- slidegate one: a call that is one run of m >= 1 decisions alike (one key,
-- one limit of fixed_window, gcra or sliding_window, one time, one cost):
-- a request alone, or a hot key's requests that waited for the same call.
-- The same reply as `scripts::MULTI` gives such a call, for less: no hash
-- cache, no shape tables, no charges, no sliding_log (src/batch.rs picks
-- the script).
--
-- Sent last, after prelude.lua, the three algorithm scripts, decide.lua
-- and run.lua, all joined by src/lib.rs (`scripts::ONE`).
--
-- KEYS[1]  the limit's key (`<prefix><tag>:{<key>}`).
-- ARGV     the limit as batch.lua takes it (its algorithm `f`, `g` or `w`
--          and its four figures), the time in microseconds (-1 for the
--          server's TIME), the cost, and m.
-- Reply    run.lua's `decide_run`: for m = 1 the decision's 8 integers,
--          packed (decide.lua's `packed`).

local q = {
  kind = ARGV[1],
  f1 = tonumber(ARGV[2]),
  f2 = tonumber(ARGV[3]),
  f3 = tonumber(ARGV[4]),
  f4 = ARGV[5],
  keys = KEYS,
}
set_now(clock(ARGV[6]))
local out = {}
local n = decide_run({ decides = true, k = 1, q }, { tonumber(ARGV[7]) }, tonumber(ARGV[8]), out, 0)
return packed(out, n)
