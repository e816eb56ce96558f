-- Open a stream's lease in a set of open streams (a namespace's or a credential's), unless
-- the set is at its cap. Leases whose end has passed (their process stopped renewing them)
-- are dropped first. KEYS: read_lease_keys; ARGV: read_lease (cap '' for none).
-- Returns {1, open} when taken, {0, open} when the set is full.
local k = read_lease_keys(KEYS, 1)
local a = read_lease(ARGV, 1)
redis.call('ZREMRANGEBYSCORE', k.set, '-inf', a.now)
local open = redis.call('ZCARD', k.set)
if a.cap ~= '' and open >= tonumber(a.cap) then
  return {0, open}
end
redis.call('ZADD', k.set, a.lease_end, a.member)
local last = redis.call('ZRANGE', k.set, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', k.set, last[2])  -- an abandoned set goes with its last lease
return {1, open + 1}
