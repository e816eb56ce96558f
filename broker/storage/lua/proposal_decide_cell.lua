-- Decide a proposal to create or change an AMP cell: as proposal_decide.lua, and an approval
-- also brings the cell's indexes in line with the version it writes (amp_index.lua), in this
-- same call. KEYS: read_sent_keys, read_write_keys, read_proposal_keys, read_gate_keys,
-- read_cell_index_keys. ARGV: read_sent (resend.lua: a second sending of the call gets its
-- first reply), read_write, read_decide, read_gate, read_cell_prefixes, read_cell_update.
local sk, s, key_at, at, first = read_sending()
if first then
  return first
end
local k
k, key_at = read_write_keys(KEYS, key_at)
local pk
pk, key_at = read_proposal_keys(KEYS, key_at)
local gk
gk, key_at = read_gate_keys(KEYS, key_at)
local x = read_cell_index_keys(KEYS, key_at)
local a
a, at = read_write(ARGV, at)
local d
d, at = read_decide(ARGV, at)
local g
g, at = read_gate(ARGV, at)
local p
p, at = read_cell_prefixes(ARGV, at)
local u = read_cell_update(ARGV, at)
local ctx = write_context(k, a)
ctx.gate_keys, ctx.gate = gk, g
return keep_reply(sk, s, decide_proposal(ctx, a, d, pk,
                                         function(entry) index_cell(x, p, u, entry.ver) end))
