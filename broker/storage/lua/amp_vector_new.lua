-- AMP: store a new cell's vector, made at its create, and list its owner's other vectors, in one
-- call (broker/amp/duplicates.py).
-- KEYS: read_new_vector_keys (the cell's entry, its vector hash, the set of unembedded cells,
--   the namespace's key index, the vector log).
-- ARGV: read_new_vector (cell id, entry version embedded, model, dimensions, text digest, the
--   vector's float32 bytes, the key prefixes of vector hashes, index records and entries, the
--   owner's key prefix, how many of the owner's keys to look at, the time now, how many records
--   the vector log keeps, '1' to return the owner's vectors or '0' to leave them out: the caller
--   has them in its process's vector index and checks them by their digest, and the agent
--   creating). The vector is stored, announced in the vector log, and the cell taken out of the
--   unembedded set (the embedder loop need not embed it again), only while the entry still
--   holds the version embedded.
-- Returns {1 when stored else 0, then, of the other cells of the owner whose vector has the model
-- and size given, in one string each: their ids and their text digests (separated by spaces),
-- their vectors one after another ('' when left out), and one character per cell saying whether
-- it may be listed among the agent's near duplicates by its index record, when that is current
-- (the vector, the record and the live entry all of one version): '1' when it is active or
-- stale, not expired and readable by the agent, else '0'; '?' when not current (the caller reads
-- the cell itself)}. Four strings, however many cells: the caller decodes four values, not
-- four per cell.
local k = read_new_vector_keys(KEYS, 1)
local a = read_new_vector(ARGV, 1)
local stored = 0
if redis.call('HGET', k.entry, 'ver') == a.version then
  redis.call('HSET', k.vector, 'model', a.model, 'dims', a.dims, 'digest', a.digest,
             'vec', a.vector, 'ver', a.version)
  redis.call('SREM', k.unembedded, a.id)
  redis.call('XADD', k.log, 'MAXLEN', '~', a.keep, '*', 'id', a.id)
  stored = 1
end
local ids, digests, vectors, listed = {}, {}, {}, {}
local now = tonumber(a.now)
local keys = redis.call('ZRANGEBYLEX', k.index, '[' .. a.owner, '[' .. a.owner .. '\255',
                        'LIMIT', 0, tonumber(a.limit))
for _, key in ipairs(keys) do
  local id = string.sub(key, #a.owner + 1)
  if id ~= a.id then
    local v = redis.call('HMGET', a.vectors .. id, 'model', 'digest', 'vec', 'ver')
    if v[1] == a.model and v[2] and v[3] and #v[3] == #a.vector then
      local listable = '?'
      local e = redis.call('HMGET', a.entries .. key, 'ver', 'del', 'exp')
      local r = redis.call('HMGET', a.records .. id, 'ver', 'status', 'expires', 'readers')
      local expiry = tonumber(e[3] or '')
      if v[4] and e[1] == v[4] and r[1] == v[4] and e[2] ~= '1' and r[2] and r[4]
          and not (expiry and expiry <= now) then
        local expires = string.match(r[3] or '', '^%d+$') and tonumber(r[3])
        listable = '0'
        if (r[2] == 'active' or r[2] == 'stale') and not (expires and expires <= now) then
          for glob in string.gmatch(r[4], '%S+') do
            if glob_match(glob, a.agent) then
              listable = '1'
              break
            end
          end
        end
      end
      ids[#ids + 1], digests[#digests + 1], listed[#listed + 1] = id, v[2], listable
      if a.send == '1' then
        vectors[#vectors + 1] = v[3]
      end
    end
  end
end
return {stored, table.concat(ids, ' '), table.concat(digests, ' '), table.concat(vectors),
        table.concat(listed)}
