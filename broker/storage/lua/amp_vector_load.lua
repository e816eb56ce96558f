-- AMP: several cells' vectors in one call. KEYS: the cells' vector hashes.
-- Returns, per key, its model, text digest and vector (nil for what the hash does not hold).
local found = {}
for i, key in ipairs(KEYS) do
  found[i] = redis.call('HMGET', key, 'model', 'digest', 'vec')
end
return found
