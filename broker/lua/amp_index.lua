-- AMP: bring a cell's index entries in line with its latest write.
-- KEYS[1..7]: created order, due sets (stale, archive, expire, purge), the recheck set, the set
--   of cells whose terms are not yet posted.
-- ARGV[1..3]: the namespace's entry, record and term key prefixes.
-- A cell's update at ARGV[at..]: id, MEMP key, version written ('' = no write to check),
--   status, reference time, access count ('' = keep), last access ('' = keep), created
--   ('' = already in the creation order), due times (stale, archive, expire, purge; '' = not
--   due), recheck mark ('1' set, '0' clear, '' keep), the globs of the agents that may read it
--   (space-separated), its expiry ('' = none), the number of search terms the cell now has
--   (-1 = unchanged), those terms. New terms go into the record (`terms`) and the cell into the
--   unposted set; amp_post.lua brings the term sets in line with them later, in batches, from
--   the terms it posted before (`posted`), and search looks at unposted cells itself.

-- Where the update after the one at `at` starts.
local function next_update(at)
  return at + 16 + math.max(tonumber(ARGV[at + 15]), 0)
end

-- Apply the update at `at`. `written` is the version a write in this same call just stored;
-- otherwise a cell whose entry is past the version named is skipped: a later writer replaced
-- it and indexes it itself.
local function index_cell(at, written)
  local id, key, version, status = ARGV[at], ARGV[at + 1], written or ARGV[at + 2], ARGV[at + 3]
  local ref, count, accessed, created = ARGV[at + 4], ARGV[at + 5], ARGV[at + 6], ARGV[at + 7]
  local recheck, readers, expires = ARGV[at + 12], ARGV[at + 13], ARGV[at + 14]
  local terms = tonumber(ARGV[at + 15])
  if not written and version ~= ''
      and redis.call('HGET', ARGV[1] .. key, 'ver') ~= version then
    return
  end
  local record = ARGV[2] .. id
  local stored = redis.call('HMGET', record, 'key', 'ref', 'dues')
  local known = stored[1]  -- a new record is in no index yet: nothing to take out
  local fields = {'key', key, 'status', status, 'readers', readers, 'expires', expires}
  if version ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'ver', version  -- the version indexed
  end
  local stored_ref = tonumber(stored[2] or '0')
  if stored_ref < tonumber(ref) then
    fields[#fields + 1], fields[#fields + 2] = 'ref', ref
  elseif stored_ref > tonumber(ref) and status == 'stale' then
    recheck = '1'  -- read since the writer looked: the engine must look again
  end
  if count ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'count', count
  end
  if accessed ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'accessed', accessed
  end
  if terms >= 0 then
    fields[#fields + 1] = 'terms'
    fields[#fields + 1] = table.concat(ARGV, ' ', at + 16, at + 15 + terms)
    if not known then
      fields[#fields + 1], fields[#fields + 2] = 'posted', ''
    else
      local was = redis.call('HMGET', record, 'terms', 'posted')
      if not was[2] then
        -- A record from before terms were posted later: its terms are in the term sets.
        fields[#fields + 1], fields[#fields + 2] = 'posted', was[1] or ''
      end
    end
    redis.call('SADD', KEYS[7], id)
  end
  -- The record lists the due sets the cell is in; one without that list may be in any.
  local dues = ''
  for t = 1, 4 do
    local due = ARGV[at + 7 + t]
    if due ~= '' then
      redis.call('ZADD', KEYS[1 + t], due, id)
      dues = dues .. t
    elseif known and (not stored[3] or string.find(stored[3], t, 1, true)) then
      redis.call('ZREM', KEYS[1 + t], id)
    end
  end
  fields[#fields + 1], fields[#fields + 2] = 'dues', dues
  redis.call('HSET', record, unpack(fields))
  if created ~= '' then
    redis.call('ZADD', KEYS[1], created, id)
  end
  if recheck == '1' then
    redis.call('SADD', KEYS[6], id)
  elseif recheck == '0' and known then
    redis.call('SREM', KEYS[6], id)
  end
end
