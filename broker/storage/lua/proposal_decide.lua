-- Approve, reject or expire a pending proposal. KEYS: read_write_keys, read_proposal_keys,
-- read_gate_keys. ARGV: read_write (for an approval, the write itself, conditioned on the
-- proposal's base version), read_decide, read_gate (an approval's write is held to its
-- quotas). Returns {'ok', the written entry's verdict or ''}, {'decided', status},
-- {'missing', ''}, {'early', ''} (not yet due to expire), or the write's own failed verdict
-- ('precondition_failed': the key moved; 'write_conflict'; 'quota_exceeded', 'uncounted'),
-- with nothing changed.
local k, key_at = read_write_keys(KEYS, 1)
local pk
pk, key_at = read_proposal_keys(KEYS, key_at)
local gk = read_gate_keys(KEYS, key_at)
local a, at = read_write(ARGV, 1)
local d
d, at = read_decide(ARGV, at)
local ctx = write_context(k, a)
ctx.gate_keys, ctx.gate = gk, read_gate(ARGV, at)
return decide_proposal(ctx, a, d, pk, nil)
