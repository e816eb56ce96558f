-- AMP: bring cells' index entries in line with their latest writes.
-- KEYS: created order, due sets (stale, archive, expire, purge), the recheck set.
-- ARGV[1..3]: the namespace's entry, record and term key prefixes; then per cell:
--   id, MEMP key, version written ('' = no write to check), status, reference time, access count
--   ('' = keep), last access ('' = keep), created, due times (stale, archive, expire, purge;
--   '' = not due), recheck mark ('1' set, '0' clear, '' keep), the number of terms to add,
--   those terms, the number of terms to remove, those terms.
-- A cell whose entry is past the version written is skipped: a later writer replaced it and
-- indexes it itself.
local entry_prefix, record_prefix, term_prefix = ARGV[1], ARGV[2], ARGV[3]
local at = 4
while at <= #ARGV do
  local id, key, version, status = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local ref, count, accessed, created = ARGV[at + 4], ARGV[at + 5], ARGV[at + 6], ARGV[at + 7]
  local recheck = ARGV[at + 12]
  local adds = tonumber(ARGV[at + 13])
  local removes = tonumber(ARGV[at + 14 + adds])
  if version == '' or redis.call('HGET', entry_prefix .. key, 'ver') == version then
    local record = record_prefix .. id
    redis.call('HSET', record, 'key', key, 'status', status)
    local stored_ref = tonumber(redis.call('HGET', record, 'ref') or '0')
    if stored_ref < tonumber(ref) then
      redis.call('HSET', record, 'ref', ref)
    elseif stored_ref > tonumber(ref) and status == 'stale' then
      recheck = '1'  -- read since the writer looked: the engine must look again
    end
    if count ~= '' then
      redis.call('HSET', record, 'count', count)
    end
    if accessed ~= '' then
      redis.call('HSET', record, 'accessed', accessed)
    end
    redis.call('ZADD', KEYS[1], created, id)
    for t = 1, 4 do
      local due = ARGV[at + 7 + t]
      if due == '' then
        redis.call('ZREM', KEYS[1 + t], id)
      else
        redis.call('ZADD', KEYS[1 + t], due, id)
      end
    end
    if recheck == '1' then
      redis.call('SADD', KEYS[6], id)
    elseif recheck == '0' then
      redis.call('SREM', KEYS[6], id)
    end
    for t = at + 14, at + 13 + adds do
      redis.call('SADD', term_prefix .. ARGV[t], id)
    end
    for t = at + 15 + adds, at + 14 + adds + removes do
      redis.call('SREM', term_prefix .. ARGV[t], id)
    end
  end
  at = at + 15 + adds + removes
end
return 0
