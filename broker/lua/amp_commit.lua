-- AMP: write cells and update their indexes, in one call (see put_entry.lua, amp_index.lua).
-- KEYS[1..7]: as amp_index.lua; KEYS[8..11]: the namespace's index, ttl, log and meta keys;
--   then the entry and history keys of each write, in order.
-- ARGV[1..3]: as amp_index.lua; then per cell: the number of its write's arguments (0 when it
--   only updates the indexes), those arguments (as `put`), and its index update.
-- A cell's index update applies only when its write succeeded. Returns each write's verdict
-- ('ok', 'precondition_failed', ...).
local verdicts = {}
local log_maxlen = nil
local at = 4
while at <= #ARGV do
  local size = tonumber(ARGV[at])
  local written = nil
  local ok = true
  if size > 0 then
    local a = {unpack(ARGV, at + 1, at + size)}
    local n = #verdicts
    local ctx = write_context({KEYS[12 + 2 * n], KEYS[13 + 2 * n], KEYS[8], KEYS[9], KEYS[10],
                               '', KEYS[11]}, a[1], a[11], a[12])
    ctx.trim_later = true
    local status, entry = put(ctx, a)
    verdicts[n + 1] = status
    log_maxlen = a[12]
    ok = status == 'ok'
    written = ok and entry.ver
  end
  at = at + 1 + size
  if ok then
    index_cell(at, written)
  end
  at = next_update(at)
end
if log_maxlen then
  trim_log(KEYS[10], KEYS[11], tonumber(log_maxlen))
end
return verdicts
