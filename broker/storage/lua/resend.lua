-- A call the broker may send twice (broker/storage/resend.py): sent_before(k, s) is the reply
-- its first sending kept, if it ran, or nil; keep_reply(k, s, reply) keeps the reply for the
-- window and returns it. A window of '0' keeps nothing (a call the broker sends once).
local function sent_before(k, s)
  if s.window_ms == '0' then
    return nil
  end
  local first = redis.call('GET', k.reply)
  return first and cjson.decode(first)
end

local function keep_reply(k, s, reply)
  if s.window_ms ~= '0' then
    redis.call('SET', k.reply, cjson.encode(reply), 'PX', s.window_ms)
  end
  return reply
end
