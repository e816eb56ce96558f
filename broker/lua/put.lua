-- KEYS: entry, history, index, ttl, log, idempotency ('' when the message has no id), meta
-- ARGV: as `put` in put_entry.lua
local ctx = write_context(KEYS, ARGV[1], ARGV[11], ARGV[12], ARGV[21])
return put_reply(ctx, ARGV, put(ctx, ARGV))
