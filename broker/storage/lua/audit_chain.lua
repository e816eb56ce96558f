-- The chain's anchor and head with the newest record's id, read together.
-- KEYS: read_audit_keys. Returns {anchor, anchor_seq, head, seq, newest id or ''}.
local k = read_audit_keys(KEYS, 1)
local meta = redis.call('HMGET', k.meta, 'audit_anchor', 'audit_anchor_seq', 'audit_head',
                        'audit_seq')
local newest = redis.call('XREVRANGE', k.audit, '+', '-', 'COUNT', 1)
return {meta[1] or '', meta[2] or '', meta[3] or '', meta[4] or '',
        newest[1] and newest[1][1] or ''}
