-- One delete. KEYS: read_write_keys; ARGV: read_write.
local a = read_write(ARGV, 1)
local ctx = write_context(read_write_keys(KEYS, 1), a)
return put_reply(ctx, a, delete(ctx, a))
