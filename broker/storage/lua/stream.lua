-- Shared by the change log's and the audit log's trims.

-- Delete up to `count` of a stream's oldest records, none after position `upto` ('+' for any).
-- Returns the records deleted, oldest first (empty when there were none).
local function drop_oldest(stream_key, upto, count)
  local old = redis.call('XRANGE', stream_key, '-', upto, 'COUNT', count)
  if #old > 0 then
    local ids = {}
    for i, record in ipairs(old) do
      ids[i] = record[1]
    end
    redis.call('XDEL', stream_key, unpack(ids))
  end
  return old
end
