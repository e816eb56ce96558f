-- AMP: merge cells (docs/amp.md, "Merging cells"): one new cell written like a create, and its
-- sources archived like any status change (a new version each, with history, change-log and
-- audit records), all in this one call or nothing. Every source is first checked to be still
-- at the version the merge was decided from, so two merges of overlapping sets, on any broker
-- process, cannot both archive the same source: the second finds it changed.
-- KEYS: read_sent_keys, read_cell_index_keys, read_namespace_keys, read_gate_keys,
--   read_entry_keys of the new cell, then read_entry_keys per source, in order.
-- ARGV: read_sent (resend.lua: a second sending of the call gets its first reply),
--   read_cell_prefixes, read_gate (what the new cell's write is held to), the new cell's
--   write (read_write) and index update (read_cell_update), read_status_call, then
--   read_cell_status per source (see amp_status.lua).
-- Returns {'ok'}; {'changed', id} when a source is no longer the version decided from;
-- {verdict} or {verdict, its encoded details} when the new cell's write is refused.
local sk, s, key_at, at, first = read_sending()
if first then
  return first
end
local x, ns, gk, e
x, key_at = read_cell_index_keys(KEYS, key_at)
ns, key_at = read_namespace_keys(KEYS, key_at)
gk, key_at = read_gate_keys(KEYS, key_at)
e, key_at = read_entry_keys(KEYS, key_at)
local p
p, at = read_cell_prefixes(ARGV, at)
local g, a, u, call
g, at = read_gate(ARGV, at)
a, at = read_write(ARGV, at)
u, at = read_cell_update(ARGV, at)
call, at = read_status_call(ARGV, at)
local now = tonumber(call.now)

local sources = {}
while at <= #ARGV do
  local se, c
  se, key_at = read_entry_keys(KEYS, key_at)
  c, at = read_cell_status(ARGV, at)
  if redis.call('HGET', se.entry, 'ver') ~= c.version
      or (c.exp ~= '' and tonumber(c.exp) <= now) then
    return keep_reply(sk, s, {'changed', c.id})
  end
  sources[#sources + 1] = {se, c}
end

local ctx = write_context(
  {entry = e.entry, history = e.history, index = ns.index, ttl = ns.ttl, log = ns.log,
   idem = '', meta = ns.meta, audit = ns.audit, usage = ns.usage}, a)
ctx.trim_later = true
if g.cost ~= '0' or g.max_keys ~= '' or g.max_bytes ~= '' then
  ctx.gate_keys, ctx.gate = gk, g
end
local status, entry = put(ctx, a)
if status ~= 'ok' then
  return keep_reply(sk, s, REFUSED[status] and {status, cjson.encode({status, entry})}
    or {status})
end
index_cell(x, p, u, entry.ver)

local sctx = {
  log_key = ns.log, meta_key = ns.meta, usage_key = ns.usage, audit_key = ns.audit,
  history_limit = tonumber(call.history_limit), log_maxlen = tonumber(call.log_maxlen),
  actor = call.agent, key_id = '', request_id = '', mode = 'merge', trim_later = true,
  audit_chain = {},
}
local WRITTEN = {'val', 'ver', 'agent', 'ua', 'ts'}
local CLEARED = {'val', 'ver', 'agent', 'ua', 'ts', 'sv', 'cf', 'pr', 'apb', 'pid'}
local grown = 0
local held = held_sets()
for _, source in ipairs(sources) do
  local se, c = source[1], source[2]
  sctx.entry_key, sctx.history_key, sctx.key = se.entry, se.history, c.key
  sctx.content_hash, sctx.action = c.content_hash, 'amp-' .. c.status
  local archived = {
    id = c.entry_id, agent = call.agent, val = c.value,
    ver = tostring(tonumber(c.version) + 1), ca = c.created, ua = call.now, ts = call.now,
    ttl = c.ttl, exp = c.exp, del = '', sv = '', cf = '', pr = '0', apb = '', pid = ''}
  grown = grown + tonumber(c.grow)
  commit(sctx, archived, 'put', c.clear == '1' and CLEARED or WRITTEN)
  index_cell(x, p, {
    id = c.id, key = c.key, version = '', status = c.status, ref = c.ref, count = '',
    accessed = '', created = '', due_stale = c.due_stale, due_archive = c.due_archive,
    due_expire = c.due_expire, due_purge = c.due_purge, recheck = c.recheck}, archived.ver,
    held)
end
flush_sets(held)
count_bytes(sctx, grown)
audit_flush(sctx.meta_key, sctx.audit_chain)
trim_excess(ns.log, ns.meta, sctx.log_maxlen)
return keep_reply(sk, s, {'ok'})
