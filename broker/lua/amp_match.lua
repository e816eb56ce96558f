-- AMP: the cells whose text has any of the terms: the term sets, and the unposted cells whose
-- recorded terms have one (amp_post.lua has not reached them yet).
-- KEYS[1]: the set of unposted cells; KEYS[2..]: the terms' sets. ARGV[1]: the record key
-- prefix; ARGV[2..]: the terms, in KEYS order.
local found = redis.call('SUNION', unpack(KEYS, 2))
local terms = {}
for i = 2, #ARGV do
  terms[ARGV[i]] = true
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local recorded = redis.call('HGET', ARGV[1] .. id, 'terms')
  for term in string.gmatch(recorded or '', '%S+') do
    if terms[term] then
      found[#found + 1] = id
      break
    end
  end
end
return found
