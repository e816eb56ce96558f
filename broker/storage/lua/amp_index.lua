-- AMP: bring a cell's index entries in line with its latest write.
-- Index keys `x` (read_cell_index_keys): created order, due sets (stale, archive, expire,
--   purge), the recheck set, the set of cells whose terms are not yet posted, the set of
--   cells whose vector is not yet in line with their text (broker/amp/embedding.py).
-- Prefixes `p` (read_cell_prefixes): the namespace's entry, record and term key prefixes.
-- An update `u` (read_cell_update): id, MEMP key, version written ('' = no write to check),
--   status, reference time, access count ('' = keep), last access ('' = keep), created
--   ('' = already in the creation order), due times per transition ('' = not due), recheck
--   mark ('1' set, '0' clear, '' keep), the globs of the agents that may read it
--   (space-separated) and its expiry ('' = none), both nil when unchanged, and its search
--   terms (nil = unchanged). New terms go into the record (`terms`) and the cell into the
--   unposted set; amp_post.lua brings the term sets in line with them later, in batches, from
--   the terms it posted before (`posted`), and search looks at unposted cells itself.

local DUE_SETS = {'due_stale', 'due_archive', 'due_expire', 'due_purge'}

-- Membership changes of the sorted sets and sets. With `held` (a table from held_sets) they
-- wait there, the last change of each member winning, and flush_sets applies them with one
-- command per set and kind, as if each had been applied in turn; without it, at once.
local function held_sets()
  return {keys = {}, kinds = {}, members = {}}
end

local function change_member(held, kind, key, member, score)
  if not held then
    if kind == 'zset' then
      if score then redis.call('ZADD', key, score, member) else redis.call('ZREM', key, member) end
    elseif score then
      redis.call('SADD', key, member)
    else
      redis.call('SREM', key, member)
    end
    return
  end
  local members = held.members[key]
  if not members then
    members = {}
    held.members[key], held.kinds[key] = members, kind
    held.keys[#held.keys + 1] = key
  end
  members[member] = score or false
end

local function flush_sets(held)
  for _, key in ipairs(held.keys) do
    local added, removed = {}, {}
    for member, score in pairs(held.members[key]) do
      if not score then
        removed[#removed + 1] = member
      elseif held.kinds[key] == 'zset' then
        added[#added + 1], added[#added + 2] = score, member
      else
        added[#added + 1] = member
      end
    end
    local zset = held.kinds[key] == 'zset'
    if #added > 0 then
      redis.call(zset and 'ZADD' or 'SADD', key, unpack(added))
    end
    if #removed > 0 then
      redis.call(zset and 'ZREM' or 'SREM', key, unpack(removed))
    end
  end
  held.keys, held.kinds, held.members = {}, {}, {}
end

-- Apply update `u`. `written` is the version a write in this same call just stored; otherwise
-- a cell whose entry is past the version named is skipped: a later writer replaced it and
-- indexes it itself. `held`: see change_member.
local function index_cell(x, p, u, written, held)
  local version = written or u.version
  local recheck = u.recheck
  if not written and version ~= ''
      and redis.call('HGET', p.entry_prefix .. u.key, 'ver') ~= version then
    return
  end
  local record = p.record_prefix .. u.id
  local stored = redis.call('HMGET', record, 'key', 'ref', 'dues')
  local known = stored[1]  -- a new record is in no index yet: nothing to take out
  local fields = {'key', u.key, 'status', u.status}
  if u.readers then  -- nil: unchanged (a status change, amp_status.lua)
    fields[#fields + 1], fields[#fields + 2] = 'readers', u.readers
    fields[#fields + 1], fields[#fields + 2] = 'expires', u.expires
  end
  if version ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'ver', version  -- the version indexed
  end
  local stored_ref = tonumber(stored[2] or '0') or 0
  if stored_ref < tonumber(u.ref) then
    fields[#fields + 1], fields[#fields + 2] = 'ref', u.ref
  elseif stored_ref > tonumber(u.ref) and u.status == 'stale' then
    recheck = '1'  -- read since the writer looked: the engine must look again
  end
  if u.count ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'count', u.count
  end
  if u.accessed ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'accessed', u.accessed
  end
  if u.terms then
    fields[#fields + 1] = 'terms'
    fields[#fields + 1] = table.concat(u.terms, ' ')
    if not known then
      fields[#fields + 1], fields[#fields + 2] = 'posted', ''
    else
      local was = redis.call('HMGET', record, 'terms', 'posted')
      if not was[2] then
        -- A record from before terms were posted later: its terms are in the term sets.
        fields[#fields + 1], fields[#fields + 2] = 'posted', was[1] or ''
      end
    end
    redis.call('SADD', x.unposted, u.id)
    redis.call('SADD', x.unembedded, u.id)  -- the embedder brings its vector in line
  end
  -- The record lists the due sets the cell is in (by number); one without the list may be in
  -- any of them.
  local dues = ''
  for t, name in ipairs(DUE_SETS) do
    local due = u[name]
    if due ~= '' then
      change_member(held, 'zset', x[name], u.id, due)
      dues = dues .. t
    elseif known and (not stored[3] or string.find(stored[3], t, 1, true)) then
      change_member(held, 'zset', x[name], u.id, false)
    end
  end
  fields[#fields + 1], fields[#fields + 2] = 'dues', dues
  redis.call('HSET', record, unpack(fields))
  if u.created ~= '' then
    redis.call('ZADD', x.created, u.created, u.id)
  end
  if recheck == '1' then
    change_member(held, 'set', x.recheck, u.id, true)
  elseif recheck == '0' and known then
    change_member(held, 'set', x.recheck, u.id, false)
  end
end
