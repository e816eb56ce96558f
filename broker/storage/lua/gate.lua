-- Fair share (broker/services/limits.py, docs/limits.md): rate buckets and quotas, checked inside the
-- write scripts and by rate.lua for reads. A gate `g` (read_gate) holds each bucket's interval
-- (ms per request, '' when that rate is off) and burst, the quotas ('' when off) and the
-- request's cost in tokens; its keys `gk` (read_gate_keys) name the two buckets.

local function int(n)
  return string.format('%d', n)
end

-- A GCRA bucket: its key holds the theoretical arrival time (ms). A request costing `cost`
-- pushes it on by cost * interval, and is admitted while it stays within burst * interval of
-- now. Returns the wait (ms) when refused, else 0 and the time to keep.
local function bucket(key, interval, burst, now, cost)
  if interval == '' or cost == 0 then
    return 0, nil
  end
  interval = tonumber(interval)
  local tat = math.max(tonumber(redis.call('GET', key)) or 0, now) + cost * interval
  local wait = tat - tonumber(burst) * interval - now
  if wait > 0 then
    return wait, nil
  end
  return 0, tat
end

local function keep(key, tat, now)
  if tat then
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.ceil(tat - now) + 1)
  end
end

-- Now, in ms, by the Redis server's clock: every broker process shares it, and it is read
-- when the script runs, not when a (maybe long queued) request arrived at its broker.
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- Take the request's tokens from the agent's bucket and the namespace's, or from neither
-- (the agent's is asked first, so a runaway agent never spends the namespace's budget).
-- nil when admitted, else the refusal: {scope, retry_ms}.
local function admit(gk, g)
  local cost = tonumber(g.cost)
  if cost == 0 or (g.agent_interval == '' and g.namespace_interval == '') then
    return nil
  end
  local now = server_ms()
  local wait, agent_tat = bucket(gk.agent_rate, g.agent_interval, g.agent_burst, now, cost)
  if wait > 0 then
    return {scope = 'agent', retry_ms = int(math.ceil(wait))}
  end
  local namespace_tat
  wait, namespace_tat = bucket(gk.namespace_rate, g.namespace_interval, g.namespace_burst,
                               now, cost)
  if wait > 0 then
    return {scope = 'namespace', retry_ms = int(math.ceil(wait))}
  end
  keep(gk.agent_rate, agent_tat, now)
  keep(gk.namespace_rate, namespace_tat, now)
  return nil
end

-- Would a write adding `adds_key` (a key not in the index) and `grows` bytes take the
-- namespace past a quota? `max_bytes` holds the values and the proposals kept (`pbytes`).
-- Only growth is refused: a write that adds neither passes even over a lowered quota. nil
-- when it fits, 'uncounted' when the byte count must be made exact first (usage_count.lua),
-- else the refusal: {limit, max, used, requested}.
local function over_quota(ctx, g, adds_key, grows)
  if g.max_keys ~= '' and adds_key then
    local used = redis.call('ZCARD', ctx.index_key)
    if used + 1 > tonumber(g.max_keys) then
      return {limit = 'max_keys', max = g.max_keys, used = int(used), requested = '1'}
    end
  end
  if g.max_bytes ~= '' and grows > 0 then
    local usage = redis.call('HMGET', ctx.usage_key, 'bytes', 'counted', 'pbytes')
    if not usage[2] then
      return 'uncounted'
    end
    local used = (tonumber(usage[1]) or 0) + (tonumber(usage[3]) or 0)
    if used + grows > tonumber(g.max_bytes) then
      return {limit = 'max_bytes', max = g.max_bytes, used = int(used), requested = int(grows)}
    end
  end
  return nil
end

-- Verdicts that wrote nothing and are never remembered under the message id: the client is
-- told to come back, and the same message must then apply.
local REFUSED = {rate_limited = true, quota_exceeded = true, uncounted = true}
