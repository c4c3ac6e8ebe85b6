# Shared by the side-by-side load scripts (peers.sh, redis.sh,
# instructions.sh): the request bodies of both services, as printf formats
# with %d for the key, and wrk scripts drawing keys from them.

# slidegate's `POST /json` and Limitador's `POST /check_and_report`, on
# the limit of edge.yaml and limitador.yaml.
sg_body='{"domain":"edge_proxy","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.%d.1"}]}]}'
li_body='{"namespace":"edge_proxy","values":{"remote_address":"10.0.%d.1"},"delta":1}'

# wrk_script FILE PATH BODY KEYS: a wrk script posting BODY (a format with
# %d for the key) to PATH, over KEYS keys drawn at random.
wrk_script() {
  cat >"$1" <<WRK
local headers = { ["Content-Type"] = "application/json" }
local bodies = {}
for i = 1, $4 do bodies[i] = string.format('$3', i) end
request = function()
  return wrk.format("POST", "$2", headers, bodies[math.random(1, $4)])
end
WRK
}
