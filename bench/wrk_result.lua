-- Shared by bench/wrk.lua and bench/replay.lua, which load it with dofile: numbers wrk's
-- threads, counts every non-2xx response by status, and has `done` print one line,
-- "BENCH_RESULT {json}", for bench/servers.py (run_wrk) to parse.

local threads = {}
non2xx = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
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
