-- Move API keys from the layout of releases before Cluster support (`memp:apikey:<digest>`
-- and `memp:apikeys`) to the hash-tagged one, in one atomic call: a key revoked or created
-- meanwhile by another process cannot be lost or revived. One server only (the old layout
-- never ran on a Cluster). KEYS: read_upgrade_keys; ARGV: read_upgrade.
-- Returns how many keys it moved.
local k = read_upgrade_keys(KEYS, 1)
local a = read_upgrade(ARGV, 1)
local ids = redis.call('HGETALL', k.old_ids)
for i = 1, #ids, 2 do
  local id, digest = ids[i], ids[i + 1]
  local record = redis.call('GET', a.old_prefix .. digest)
  if record then
    redis.call('SET', a.new_prefix .. digest, record)
    redis.call('DEL', a.old_prefix .. digest)
    redis.call('HSET', k.new_ids, id, digest)
  end
end
redis.call('DEL', k.old_ids)
return #ids / 2
