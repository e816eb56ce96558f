-- AMP: how many cells there are, and how many have each term, counting the unposted cells by
-- their recorded terms (amp_post.lua has not reached them yet) rather than what is posted.
-- KEYS: read_cell_terms_keys (the set of unposted cells, the creation order, then the terms'
-- sets). ARGV: read_cell_terms (the record key prefix, then the terms, in KEYS order).
-- Returns {cells, count of the first term, count of the second, ...}.
local k = read_cell_terms_keys(KEYS, 1)
local a = read_cell_terms(ARGV, 1)
local counts, index = {}, {}
for i, term in ipairs(a.terms) do
  counts[i] = redis.call('SCARD', k.term_sets[i])
  index[term] = i
end
local function words(text)
  local set = {}
  for word in string.gmatch(text or '', '%S+') do
    set[word] = true
  end
  return set
end
for _, id in ipairs(redis.call('SMEMBERS', k.unposted)) do
  local stored = redis.call('HMGET', a.record_prefix .. id, 'terms', 'posted')
  local recorded, posted = words(stored[1]), words(stored[2])
  for term, at in pairs(index) do
    if recorded[term] and not posted[term] then
      counts[at] = counts[at] + 1
    elseif posted[term] and not recorded[term] then
      counts[at] = counts[at] - 1
    end
  end
end
table.insert(counts, 1, redis.call('ZCARD', k.created))
return counts
