-- wrk script for bench.strategies and bench.amp: replays requests built in advance by Python.
-- usage: wrk ... URL -- POOL_FILE
-- POOL_FILE holds whole HTTP/1.1 requests, each as "<byte length>\n<bytes>"; every request()
-- sends a random one. Non-2xx responses are counted by status, and `done` prints one line,
-- "BENCH_RESULT {json}", with the same fields as bench/wrk.lua.

local requests = {}
local threads = {}
non2xx = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  local file = assert(io.open(args[1], "rb"))
  while true do
    local length = file:read("*l")
    if not length then
      break
    end
    requests[#requests + 1] = file:read(tonumber(length))
  end
  file:close()
  assert(#requests > 0, "empty request pool")
  math.randomseed(os.time() * 1000 + id)
end

function request()
  return requests[math.random(#requests)]
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
