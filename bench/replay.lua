-- wrk script for bench.strategies and bench.amp: replays requests built in advance by Python.
-- usage: wrk ... URL -- POOL_FILE
-- POOL_FILE holds whole HTTP/1.1 requests, each as "<byte length>\n<bytes>"; every request()
-- sends a random one. Non-2xx responses are counted by status, and `done` prints one line,
-- "BENCH_RESULT {json}", with the same fields as bench/wrk.lua.

local requests = {}

-- setup, response and done (the non-2xx counts and the BENCH_RESULT line), from the file beside
-- this one: wrk runs scripts in LuaJIT with its standard libraries, dofile among them.
dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "wrk_result.lua")

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
