/**
 * Typed results. The broker speaks snake_case JSON (see `openapi.yaml`); the SDK hands out the
 * same fields in camelCase. Unknown fields from newer brokers are ignored.
 */

/** Why a value does not conform to a JSON Schema: which schema, where (JSON Pointer), what. */
export interface SchemaError {
  schemaId: string
  path: string
  message: string
}

/** A path that a merge write and the stored entry both changed differently since the base. */
export interface Conflict {
  path: string
  base: unknown
  stored: unknown
  incoming: unknown
  storedAgent: string | null
  incomingAgent: string | null
  baseMissing: boolean
}

/** The warnings a write or an event may carry (`MEMP-Warning`). */
export const WARNINGS = ['schema_violation', 'conflicts'] as const

/** What a write or an event asks its reader to look at: `schema_violation`, `conflicts`. */
export type Warning = (typeof WARNINGS)[number] | (string & {})

/** One version of a memory entry; times are Unix milliseconds. */
export interface Entry<T = any> {
  id: string
  /** The agent (or key id, or `admin`) that wrote this version. */
  agentId: string
  namespace: string
  key: string
  /** The stored JSON value; null on tombstones. */
  value: T
  ttlSeconds: number | null
  version: number
  createdAt: number
  updatedAt: number
  /** The write's last-write-wins timestamp. */
  timestamp: number | null
  expiresAt: number | null
  schemaViolation: boolean
  /** True only on tombstones (delete replies and history). */
  deleted: boolean
  /** With `schemaViolation`: why the value does not conform. */
  schemaErrors: SchemaError[] | null
  /** Paths a merge write flagged. */
  conflicts: Conflict[] | null
  /** On a version an approved proposal wrote: who approved it, and the proposal. */
  approvedBy: string | null
  proposalId: string | null
  /** The `MEMP-Warning` words: `schema_violation` and/or `conflicts`; empty when all is well. */
  warnings: Warning[]
}

/** A registered agent (MEMP draft, Data Schema). */
export interface Agent {
  id: string
  name: string
  framework: string
  namespace: string
  createdAt: number
  lastSeen: number
}

/** A token handed out once, at registration or key creation. */
export interface Credentials {
  apiKey: string
  keyId: string
  agentId: string | null
}

/** Every permission a grant may carry. */
export const PERMISSIONS = [
  'read',
  'write',
  'subscribe',
  'admin',
  'impersonate',
  'amp',
  'review',
  'audit',
] as const

export type Permission = (typeof PERMISSIONS)[number]

/** Permissions on the namespaces a glob names (`acme-*`, `acme-crm`, `*`). */
export interface Grant {
  namespace: string
  permissions: Permission[]
}

/** What the broker keeps about an API key (never the key itself). */
export interface ApiKey {
  id: string
  name: string
  grants: Grant[]
  agentId: string | null
  createdAt: number
  createdBy: string
}

/** A new API key: `apiKey` is shown only this once. */
export interface CreatedKey {
  apiKey: string
  key: ApiKey
}

/** One page of a query; pass `nextCursor` back as `cursor` until it is null. */
export interface Page<T = any> {
  entries: Entry<T>[]
  nextCursor: string | null
}

/** The events a subscription hands out. */
export const EVENT_TYPES = [
  'put',
  'delete',
  'expire',
  'snapshot',
  'snapshot-end',
  'reset',
  'proposal',
  'approved',
  'rejected',
  'expired',
] as const

export type EventType = (typeof EVENT_TYPES)[number]

/**
 * The events that end a stream. A subscription resumes from their cursor instead of handing
 * them out; after `revoked` the reconnect is refused, and that error ends the subscription.
 */
export const END_EVENT_TYPES = ['overflow', 'shutdown', 'revoked'] as const

/** Events that only move the cursor (a `filter` left changes out); never handed out. */
export const CURSOR_EVENT_TYPES = ['progress'] as const

/**
 * One subscription event. `put`, `delete`, `expire` and `snapshot` carry the entry version;
 * `snapshot-end` marks the end of the snapshot; `reset` says the broker could not replay
 * `namespace` from the cursor, so changes there may have been missed.
 */
export interface MempEvent<T = any> {
  type: EventType
  /** The resume cursor after this event (null for snapshot entries). */
  id: string | null
  namespace: string | null
  entry: Entry<T> | null
  key: string | null
  /** The entry's value; null for deletes, expiries and markers. */
  value: T | null
  version: number | null
  /** Why a `reset` happened. */
  reason: string | null
  warnings: Warning[]
}

// ---- the wire (snake_case) and the conversions ----

export interface WireEntry {
  id: string
  agent_id: string
  namespace: string
  key: string
  value: unknown
  ttl_seconds?: number | null
  version: number
  created_at: number
  updated_at: number
  timestamp?: number | null
  expires_at?: number | null
  schema_violation?: boolean
  deleted?: boolean
  schema_errors?: { schema_id: string; path: string; message: string }[] | null
  approved_by?: string | null
  proposal_id?: string | null
  conflicts?: {
    path: string
    base?: unknown
    stored?: unknown
    incoming?: unknown
    stored_agent?: string | null
    incoming_agent?: string | null
    base_missing?: boolean
  }[] | null
}

export interface WireAgent {
  id: string
  name: string
  framework: string
  namespace: string
  created_at: number
  last_seen: number
}

export interface WireApiKey {
  id: string
  name: string
  grants: Grant[]
  agent_id?: string | null
  created_at: number
  created_by: string
}

export interface WireCredentials {
  api_key: string
  key_id: string
  agent_id?: string | null
}

/** The camelCase entry for a wire entry; `headerWarnings` are from `MEMP-Warning`. */
export function toEntry<T = any>(wire: WireEntry, headerWarnings: string[] = []): Entry<T> {
  const schemaErrors = wire.schema_errors
    ? wire.schema_errors.map((e) => ({ schemaId: e.schema_id, path: e.path, message: e.message }))
    : null
  const conflicts = wire.conflicts
    ? wire.conflicts.map((c) => ({
        path: c.path,
        base: c.base ?? null,
        stored: c.stored ?? null,
        incoming: c.incoming ?? null,
        storedAgent: c.stored_agent ?? null,
        incomingAgent: c.incoming_agent ?? null,
        baseMissing: c.base_missing ?? false,
      }))
    : null
  const schemaViolation = wire.schema_violation ?? false
  const warnings = new Set<string>(headerWarnings)
  if (schemaViolation) warnings.add('schema_violation')
  if (conflicts) warnings.add('conflicts')
  return {
    id: wire.id,
    agentId: wire.agent_id,
    namespace: wire.namespace,
    key: wire.key,
    value: (wire.value ?? null) as T,
    ttlSeconds: wire.ttl_seconds ?? null,
    version: wire.version,
    createdAt: wire.created_at,
    updatedAt: wire.updated_at,
    timestamp: wire.timestamp ?? null,
    expiresAt: wire.expires_at ?? null,
    schemaViolation,
    deleted: wire.deleted ?? false,
    schemaErrors,
    conflicts,
    approvedBy: wire.approved_by ?? null,
    proposalId: wire.proposal_id ?? null,
    warnings: [...warnings],
  }
}

export function toAgent(wire: WireAgent): Agent {
  return {
    id: wire.id,
    name: wire.name,
    framework: wire.framework,
    namespace: wire.namespace,
    createdAt: wire.created_at,
    lastSeen: wire.last_seen,
  }
}

export function toApiKey(wire: WireApiKey): ApiKey {
  return {
    id: wire.id,
    name: wire.name,
    grants: wire.grants,
    agentId: wire.agent_id ?? null,
    createdAt: wire.created_at,
    createdBy: wire.created_by,
  }
}

export function toCredentials(wire: WireCredentials): Credentials {
  return { apiKey: wire.api_key, keyId: wire.key_id, agentId: wire.agent_id ?? null }
}

/** The words of a `MEMP-Warning` header (`schema_violation, conflicts`). */
export function parseWarnings(header: string | null): string[] {
  if (!header) return []
  return header
    .split(',')
    .map((word) => word.trim())
    .filter((word) => word !== '')
}
