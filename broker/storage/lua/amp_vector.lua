-- AMP: store one cell's vector, only while its entry still holds the version that was embedded.
-- KEYS: read_vector_keys (the cell's entry, its vector hash, the set of unembedded cells, the
--   vector log). ARGV: read_vector_save (cell id, entry version embedded, model, dimensions,
--   text digest, the vector's float32 bytes, how many records the log keeps), stored with the
--   version. A cell written since it was read goes back into the unembedded set, so the
--   embedder looks at it again. A stored vector is announced in the log. Returns 1 when
--   stored, else 0.
local k = read_vector_keys(KEYS, 1)
local a = read_vector_save(ARGV, 1)
if redis.call('HGET', k.entry, 'ver') ~= a.version then
  redis.call('SADD', k.unembedded, a.id)
  return 0
end
redis.call('HSET', k.vector, 'model', a.model, 'dims', a.dims, 'digest', a.digest,
           'vec', a.vector, 'ver', a.version)
redis.call('XADD', k.log, 'MAXLEN', '~', a.keep, '*', 'id', a.id)
return 1
