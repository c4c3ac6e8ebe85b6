-- 100,000 keys, drawn at random, through the ad-hoc API of POST /v1/check.
local bodies = {}
for i = 1, 100000 do
  bodies[i] = '{"key":"client-' .. i .. '","limit":1000,"window":"1m"}'
end
local headers = { ["Content-Type"] = "application/json" }
request = function()
  return wrk.format("POST", "/v1/check", headers, bodies[math.random(1, 100000)])
end
