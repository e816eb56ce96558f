-- One put. KEYS: read_write_keys, read_gate_keys; ARGV: read_write, read_gate.
local a, at = read_write(ARGV, 1)
local k, key_at = read_write_keys(KEYS, 1)
local ctx = write_context(k, a)
ctx.gate_keys, ctx.gate = read_gate_keys(KEYS, key_at), read_gate(ARGV, at)
return put_reply(ctx, a, put(ctx, a))
