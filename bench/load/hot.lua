-- One hot key through the ad-hoc API of POST /v1/check.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"key":"hot","limit":1000000000,"window":"1m"}'
