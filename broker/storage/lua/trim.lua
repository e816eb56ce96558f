-- Age retention: drop change-log records logged at or before a position. KEYS: read_log_keys;
-- ARGV: read_trim. Returns how many records it dropped.
local k = read_log_keys(KEYS, 1)
local a = read_trim(ARGV, 1)
return trim_log(k.log, k.meta, a.upto, tonumber(a.count))
