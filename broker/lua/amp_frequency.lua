-- AMP: how many cells there are, and how many have each term, counting the unposted cells by
-- their recorded terms (amp_post.lua has not reached them yet) rather than what is posted.
-- KEYS[1]: the set of unposted cells; KEYS[2]: the creation order; KEYS[3..]: the terms' sets.
-- ARGV[1]: the record key prefix; ARGV[2..]: the terms, in KEYS order.
-- Returns {cells, count of the first term, count of the second, ...}.
local counts, index = {}, {}
for i = 2, #ARGV do
  counts[i - 1] = redis.call('SCARD', KEYS[i + 1])
  index[ARGV[i]] = i - 1
end
local function words(text)
  local set = {}
  for word in string.gmatch(text or '', '%S+') do
    set[word] = true
  end
  return set
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local stored = redis.call('HMGET', ARGV[1] .. id, 'terms', 'posted')
  local recorded, posted = words(stored[1]), words(stored[2])
  for term, at in pairs(index) do
    if recorded[term] and not posted[term] then
      counts[at] = counts[at] + 1
    elseif posted[term] and not recorded[term] then
      counts[at] = counts[at] - 1
    end
  end
end
table.insert(counts, 1, redis.call('ZCARD', KEYS[2]))
return counts
