-- slidegate's script prelude: the helpers every script uses, sent to Redis
-- in front of each script (src/lib.rs joins them), so they are written once.

-- The time in microseconds: ARGV's when it is not negative, else the
-- server's TIME.
local function clock(arg)
  local now = tonumber(arg)
  if now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- floor(a / b) and a mod b, exact for 0 <= a, b < 2^52.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

-- An integer as Redis wants it written (no exponent, no fraction).
local function int(x)
  return string.format('%d', x)
end

