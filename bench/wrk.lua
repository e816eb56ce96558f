-- wrk script for bench.http: PUTs or GETs spread uniformly over N keys of one namespace.
-- usage: wrk ... URL -- METHOD NAMESPACE KEYS VALUE_BYTES TOKEN
-- Requests are built once per thread; every non-2xx response is counted by status, and
-- `done` prints one line, "BENCH_RESULT {json}", for bench.http to parse.

local requests = {}
local nkeys = 0

-- setup, response and done (the non-2xx counts and the BENCH_RESULT line), from the file beside
-- this one: wrk runs scripts in LuaJIT with its standard libraries, dofile among them.
dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "wrk_result.lua")

local function put_body(value_bytes)
  -- {"value": V} where V is {"text": "xxx..."}, exactly `value_bytes` long (as bench/client.py).
  local frame = '{"text":""}'
  return '{"value":{"text":"' .. string.rep("x", math.max(value_bytes - #frame, 0)) .. '"}}'
end

function init(args)
  local method, namespace = args[1], args[2]
  nkeys = tonumber(args[3])
  local size, token = tonumber(args[4]), args[5]
  local headers = { ["Content-Type"] = "application/json" }
  if token and token ~= "" then
    headers["Authorization"] = "Bearer " .. token
  end
  local body = nil
  if method == "PUT" then
    body = put_body(size)
  end
  for i = 1, nkeys do
    local path = string.format("/v1/namespaces/%s/memory/bench/key-%05d", namespace, i - 1)
    requests[i] = wrk.format(method, path, headers, body)
  end
  math.randomseed(os.time() * 1000 + id)
end

function request()
  return requests[math.random(nkeys)]
end
