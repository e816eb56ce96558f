-- AMP: the cells whose text has any of the terms: the term sets, and the unposted cells whose
-- recorded terms have one (amp_post.lua has not reached them yet).
-- KEYS: read_cell_terms_keys (the set of unposted cells, then the terms' sets).
-- ARGV: read_cell_terms (the record key prefix, then the terms, in KEYS order).
local k = read_cell_terms_keys(KEYS, 1)
local a = read_cell_terms(ARGV, 1)
local found = redis.call('SUNION', unpack(k.term_sets))
local terms = {}
for _, term in ipairs(a.terms) do
  terms[term] = true
end
for _, id in ipairs(redis.call('SMEMBERS', k.unposted)) do
  local recorded = redis.call('HGET', a.record_prefix .. id, 'terms')
  for term in string.gmatch(recorded or '', '%S+') do
    if terms[term] then
      found[#found + 1] = id
      break
    end
  end
end
return found
