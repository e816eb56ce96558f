-- AMP: post the search terms of cells whose terms changed (see amp_index.lua) to the term sets.
-- KEYS: read_cell_post_keys (the set of unposted cells). ARGV: read_cell_post (the record and
-- term key prefixes, the most cells to post). Each cell leaves the unposted set and reaches
-- the term sets in this one call, so a search always finds it in one or the other. Returns
-- the number of cells taken.
local k = read_cell_post_keys(KEYS, 1)
local a = read_cell_post(ARGV, 1)
local ids = redis.call('SPOP', k.unposted, a.limit)
local added, removed = {}, {}  -- term -> ids
local function note(into, term, id)
  local list = into[term]
  if not list then
    list = {}
    into[term] = list
  end
  list[#list + 1] = id
end
for _, id in ipairs(ids) do
  local record = a.record_prefix .. id
  local stored = redis.call('HMGET', record, 'key', 'terms', 'posted')
  if stored[1] then
    local wanted, had = {}, {}
    for term in string.gmatch(stored[2] or '', '%S+') do
      wanted[term] = true
    end
    for term in string.gmatch(stored[3] or '', '%S+') do
      had[term] = true
      if not wanted[term] then
        note(removed, term, id)
      end
    end
    for term in pairs(wanted) do
      if not had[term] then
        note(added, term, id)
      end
    end
    redis.call('HSET', record, 'posted', stored[2] or '')
  end
end
-- One command per term for the whole batch: common words are shared by many cells.
for term, list in pairs(added) do
  redis.call('SADD', a.term_prefix .. term, unpack(list))
end
for term, list in pairs(removed) do
  redis.call('SREM', a.term_prefix .. term, unpack(list))
end
return #ids
