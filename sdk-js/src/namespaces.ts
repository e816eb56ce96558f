/** Namespace configuration and JSON Schemas (`client.namespaces`, `client.schemas`). */

import { getResource, namespacePath, type ClientScope } from './resources.js'
import type { CallOptions, Transport } from './transport.js'

export type Strategy = 'last-write-wins' | 'agent-priority' | 'merge'

/** A namespace's fair share: write and read rates (per second, with a burst: how many at once;
 * default the rate) and quotas on live keys, stored bytes and open streams. A field left out is
 * no limit. */
export interface Limits {
  writes_per_second?: number
  write_burst?: number
  reads_per_second?: number
  read_burst?: number
  max_keys?: number
  max_bytes?: number
  max_streams?: number
}

/** What a namespace uses against its limits (`namespaces.usage()`, admins only). */
export interface UsageReport {
  namespace: string
  limits: Limits
  /** Live keys, bytes of stored values, open streams, pending proposals and bytes of the
   * proposals kept (`max_bytes` holds both byte counts), on every broker process
   * (`proposals` and `proposal_bytes` are missing from a broker that does not report them). */
  usage: {
    keys: number
    bytes: number
    streams: number
    proposals?: number
    proposal_bytes?: number
  }
  /** The limits every agent (and credential) has from the broker's settings; null: none. */
  agent_defaults: {
    writes_per_second: number | null
    write_burst: number | null
    reads_per_second: number | null
    read_burst: number | null
    max_streams_per_token: number | null
    /** Pending proposals a namespace may hold (MEMP_MAX_PENDING_PROPOSALS). */
    max_pending_proposals?: number | null
  }
}

/** A namespace's conflict strategies, agent priorities, retention, shares and limits; a field
 * left out takes the broker's default. Field names are the broker's (snake_case). */
export interface NamespaceConfig {
  strategy?: Strategy
  /** Per key pattern: a strategy, and/or `approval: 'required'` to gate writes behind review. */
  rules?: { pattern: string; strategy?: Strategy | null; approval?: 'required' | 'none' | null }[]
  priorities?: { agent: string; priority: number }[]
  default_priority?: number
  merge_arrays?: 'replace' | 'append'
  history_limit?: number | null
  default_ttl_seconds?: number | null
  shares?: { namespace: string; permissions: ('read' | 'subscribe')[] }[]
  limits?: Limits
  /** Let a reviewer approve its own proposals (refused by default). */
  allow_self_approval?: boolean
}

/** The configuration as stored, with its `revision` (pass it as `ifRevision`). */
export interface StoredConfig extends Required<NamespaceConfig> {
  namespace: string
  revision: number
  updated_at: number | null
  updated_by: string | null
}

/** A JSON Schema registered for the keys matching `pattern`. */
export interface SchemaRecord {
  id: string
  namespace: string
  pattern: string
  schema: Record<string, unknown> | boolean
  enforce: boolean
  /** The `$schema` URI the schema is validated by. */
  draft: string
  createdAt: number
  createdBy: string
}

interface WireSchema {
  id: string
  namespace: string
  pattern: string
  schema: Record<string, unknown> | boolean
  enforce: boolean
  draft: string
  created_at: number
  created_by: string
}

function toSchema(wire: WireSchema): SchemaRecord {
  return {
    id: wire.id,
    namespace: wire.namespace,
    pattern: wire.pattern,
    schema: wire.schema,
    enforce: wire.enforce,
    draft: wire.draft,
    createdAt: wire.created_at,
    createdBy: wire.created_by,
  }
}

const CONFIG_FIELDS = [
  'strategy',
  'rules',
  'priorities',
  'default_priority',
  'merge_arrays',
  'history_limit',
  'default_ttl_seconds',
  'shares',
  'limits',
  'allow_self_approval',
] as const

/** Namespace configuration (needs `admin` on the namespace). */
export class Namespaces {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  /** The configuration, with its `revision` (0 and the defaults if never set). */
  async config(options: CallOptions = {}): Promise<StoredConfig> {
    return (await getResource(this.transport, this.client, options, ['config'])) as StoredConfig
  }

  /** The namespace's usage (live keys, stored bytes, open streams) beside its limits and the
   * broker's per-agent defaults. */
  async usage(options: CallOptions = {}): Promise<UsageReport> {
    return (await getResource(this.transport, this.client, options, ['usage'])) as UsageReport
  }

  /** Replace the configuration (fields left out take their defaults); with `ifRevision`,
   * only while the stored one is that revision, else PreconditionFailedError. */
  async setConfig(
    config: NamespaceConfig,
    options: CallOptions & { ifRevision?: number | undefined } = {},
  ): Promise<StoredConfig> {
    const namespace = this.client.requireNamespace(options.namespace)
    const body: Record<string, unknown> = {}
    for (const field of CONFIG_FIELDS) if (config[field] !== undefined) body[field] = config[field]
    const headers: Record<string, string> = {}
    if (options.ifRevision !== undefined) headers['If-Match'] = `"${options.ifRevision}"`
    const reply = await this.transport.send({
      method: 'PUT',
      path: namespacePath(namespace, 'config'),
      body,
      headers,
      idempotent: options.ifRevision === undefined,
      signal: options.signal,
    })
    return reply.body as StoredConfig
  }

  /** Change only the fields given and keep the rest (re-reading if raced). */
  async updateConfig(changes: NamespaceConfig, options: CallOptions = {}): Promise<StoredConfig> {
    for (let attempt = 1; ; attempt++) {
      const current = await this.config(options)
      const merged: NamespaceConfig = {}
      for (const field of CONFIG_FIELDS) {
        ;(merged as Record<string, unknown>)[field] = changes[field] !== undefined ? changes[field] : current[field]
      }
      try {
        return await this.setConfig(merged, { ...options, ifRevision: current.revision })
      } catch (error) {
        if (attempt >= 5 || (error as { code?: string }).code !== 'precondition_failed') throw error
      }
    }
  }
}

/** JSON Schemas for key patterns (registering and deleting need `admin`). */
export class Schemas {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  /** Register (or replace) schema `id` for keys matching `pattern`. */
  async put(
    id: string,
    pattern: string,
    schema: Record<string, unknown> | boolean,
    options: CallOptions & { enforce?: boolean | undefined } = {},
  ): Promise<SchemaRecord> {
    const namespace = this.client.requireNamespace(options.namespace)
    const reply = await this.transport.send({
      method: 'PUT',
      path: namespacePath(namespace, 'schemas', id),
      body: { pattern, schema, enforce: options.enforce ?? false },
      idempotent: true,
      signal: options.signal,
    })
    return toSchema(reply.body as WireSchema)
  }

  async get(id: string, options: CallOptions = {}): Promise<SchemaRecord> {
    return toSchema((await getResource(this.transport, this.client, options, ['schemas', id])) as WireSchema)
  }

  async delete(id: string, options: CallOptions = {}): Promise<void> {
    const namespace = this.client.requireNamespace(options.namespace)
    await this.transport.send({
      method: 'DELETE',
      path: namespacePath(namespace, 'schemas', id),
      idempotent: false,
      signal: options.signal,
    })
  }

  async list(options: CallOptions = {}): Promise<SchemaRecord[]> {
    const body = (await getResource(this.transport, this.client, options, ['schemas'])) as { schemas: WireSchema[] }
    return body.schemas.map(toSchema)
  }
}
