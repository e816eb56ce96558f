-- Plain commands on keys of one hash slot, run in order as one atomic write, so that the
-- write can wait for replicas like any script call (broker/storage/writes.py).
-- KEYS: read_write_keys (each command's key, in order). ARGV: read_write_guard, then one
-- read_write_command block per command (its name and the arguments after its key).
-- With a guard, the first key must hold `expected` (a string), or not exist when `expected`
-- is nil; otherwise nothing runs and the script returns false. Returns the replies.
local k = read_write_keys(KEYS, 1)
local guard, at = read_write_guard(ARGV, 1)
if guard.check == '1' then
  local stored = redis.call('GET', k.keys[1])
  if stored ~= (guard.expected and guard.expected[1] or false) then
    return false
  end
end
local replies = {}
for i = 1, #k.keys do
  local command
  command, at = read_write_command(ARGV, at)
  replies[i] = redis.call(command.name, k.keys[i], unpack(command.args))
end
return replies
