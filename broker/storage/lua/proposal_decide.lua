-- Approve, reject or expire a pending proposal. KEYS: read_write_keys, read_proposal_keys,
-- read_gate_keys. ARGV: read_write (for an approval, the write itself, conditioned on the
-- proposal's base version), read_decide, read_gate (an approval's write is held to its
-- quotas). Returns {'ok', the written entry's verdict or ''}, {'decided', status},
-- {'missing', ''}, {'early', ''} (not yet due to expire), or the write's own failed verdict
-- ('precondition_failed': the key moved; 'write_conflict'; 'quota_exceeded', 'uncounted'),
-- with nothing changed. The KEYS and ARGV begin with read_sent_keys and read_sent
-- (resend.lua): a second sending of the call gets its first reply.
local sk, s, key_at, at, first = read_sending()
if first then
  return first
end
local k
k, key_at = read_write_keys(KEYS, key_at)
local pk
pk, key_at = read_proposal_keys(KEYS, key_at)
local gk = read_gate_keys(KEYS, key_at)
local a
a, at = read_write(ARGV, at)
local d
d, at = read_decide(ARGV, at)
local ctx = write_context(k, a)
ctx.gate_keys, ctx.gate = gk, read_gate(ARGV, at)
return keep_reply(sk, s, decide_proposal(ctx, a, d, pk, nil))
