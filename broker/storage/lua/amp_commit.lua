-- AMP: write cells and update their indexes, in one call (see put_entry.lua, amp_index.lua).
-- KEYS: read_sent_keys, read_cell_index_keys, read_namespace_keys, read_gate_keys, then
--   read_entry_keys per write, in order.
-- ARGV: read_sent (resend.lua: a second sending of the call gets its first reply),
--   read_cell_prefixes, read_gate (what each write is held to: gate.lua; an open gate for
--   the lifecycle engine), then per cell: read_change (whether it writes), its write
--   (read_write) when it does, and its index update (read_cell_update).
-- A cell's index update applies only when its write succeeded. Returns each write's verdict
-- ('ok', 'precondition_failed', ...; a refusal by the gate as {verdict, its encoded details}).
local sk, s, key_at, at, first = read_sending()
if first then
  return first
end
local x
x, key_at = read_cell_index_keys(KEYS, key_at)
local ns
ns, key_at = read_namespace_keys(KEYS, key_at)
local gk
gk, key_at = read_gate_keys(KEYS, key_at)
local p
p, at = read_cell_prefixes(ARGV, at)
local g
g, at = read_gate(ARGV, at)
local gated = g.cost ~= '0' or g.max_keys ~= '' or g.max_bytes ~= ''
local verdicts = {}
local log_maxlen = nil
while at <= #ARGV do
  local change, a, u, written
  change, at = read_change(ARGV, at)
  local ok = true
  if change.writes == '1' then
    local e
    e, key_at = read_entry_keys(KEYS, key_at)
    a, at = read_write(ARGV, at)
    local ctx = write_context(
      {entry = e.entry, history = e.history, index = ns.index, ttl = ns.ttl, log = ns.log,
       idem = '', meta = ns.meta, audit = ns.audit, usage = ns.usage}, a)
    ctx.trim_later = true
    if gated then
      ctx.gate_keys, ctx.gate = gk, g
    end
    local status, entry = put(ctx, a)
    verdicts[#verdicts + 1] = REFUSED[status] and {status, cjson.encode({status, entry})} or status
    log_maxlen = ctx.log_maxlen
    ok = status == 'ok'
    written = ok and entry.ver
  end
  u, at = read_cell_update(ARGV, at)
  if ok then
    index_cell(x, p, u, written)
  end
end
if log_maxlen then
  trim_excess(ns.log, ns.meta, log_maxlen)
end
return keep_reply(sk, s, verdicts)
