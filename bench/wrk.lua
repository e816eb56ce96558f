-- wrk script for bench.http: PUTs or GETs spread uniformly over N keys of one namespace.
-- usage: wrk ... URL -- METHOD NAMESPACE KEYS VALUE_BYTES TOKEN
-- Requests are built once per thread; every non-2xx response is counted by status, and
-- `done` prints one line, "BENCH_RESULT {json}", for bench.http to parse.

local requests = {}
local nkeys = 0
local threads = {}
non2xx = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

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

function response(status, headers, body)
  if status < 200 or status > 299 then
    non2xx[status] = (non2xx[status] or 0) + 1
  end
end

function done(summary, latency, requests)
  local totals = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("non2xx") or {}) do
      totals[status] = (totals[status] or 0) + count
    end
  end
  local statuses = {}
  for status, count in pairs(totals) do
    statuses[#statuses + 1] = string.format('"%d":%d', status, count)
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f,"socket_errors":{"connect":%d,"read":%d,"write":%d,' ..
    '"timeout":%d},"non2xx":{%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.timeout,
    table.concat(statuses, ",")))
end
