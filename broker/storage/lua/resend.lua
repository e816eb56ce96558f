-- A call the broker may send twice (broker/storage/resend.py) begins its KEYS and ARGV with
-- read_sent_keys and read_sent. read_sending() reads them: their blocks, where the rest of
-- KEYS and ARGV begins, and the reply its first sending kept if it ran (else nil), which the
-- script returns at once. keep_reply(k, s, reply) keeps the reply for the window and returns
-- it. A window of '0' keeps nothing (a call the broker sends once).
local function read_sending()
  local k, key_at = read_sent_keys(KEYS, 1)
  local s, at = read_sent(ARGV, 1)
  local first = s.window_ms ~= '0' and redis.call('GET', k.reply)
  return k, s, key_at, at, first and cjson.decode(first) or nil
end

local function keep_reply(k, s, reply)
  if s.window_ms ~= '0' then
    redis.call('SET', k.reply, cjson.encode(reply), 'PX', s.window_ms)
  end
  return reply
end
