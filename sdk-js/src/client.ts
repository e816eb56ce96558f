/** The client: `MEMP`, its `memory` and `keys`. */

import { Agents, Messages } from './agents.js'
import { Audit, Proposals, type Proposal } from './governance.js'
import { Amp } from './amp.js'
import { ApprovalPendingError, InvalidRequestError } from './errors.js'
import { Namespaces, Schemas } from './namespaces.js'
import {
  toAgent,
  toApiKey,
  toCredentials,
  toEntry,
  parseWarnings,
  type Agent,
  type CreatedKey,
  type Credentials,
  type ApiKey,
  type Entry,
  type Grant,
  type Page,
  type WireAgent,
  type WireApiKey,
  type WireCredentials,
  type WireEntry,
} from './models.js'
import { namespacePath, pageQuery, type PageOptions } from './resources.js'
import { QueryResult } from './query.js'
import {
  StreamState,
  Subscription,
  streamOptions,
  type SubscribeOptions,
} from './subscription.js'
import {
  messageId,
  resolveConfig,
  Transport,
  type CallOptions,
  type Config,
  type MempOptions,
  type Reply,
} from './transport.js'

export interface PutOptions extends CallOptions {
  /** Seconds until the entry expires (null or absent: never). */
  ttlSeconds?: number | null | undefined
  /** Write only while the stored version is this (compare-and-set), else PreconditionFailedError. */
  ifVersion?: number | undefined
  /** Write only while the key holds no entry, else PreconditionFailedError. */
  ifAbsent?: boolean | undefined
  /** The version this value was based on, so a `merge` namespace can flag conflicts. */
  baseVersion?: number | undefined
  /** The write's last-write-wins time (Unix ms or a Date); default: the broker's clock. */
  timestamp?: number | Date | undefined
  /** Make the write a proposal a reviewer must approve (ApprovalPendingError). */
  approvalRequired?: boolean | undefined
}

export interface DeleteOptions extends CallOptions {
  ifVersion?: number | undefined
  timestamp?: number | Date | undefined
  /** Make the delete a proposal a reviewer must approve (ApprovalPendingError). */
  approvalRequired?: boolean | undefined
}

export interface QueryOptions extends CallOptions {
  /** Entries per page (the broker's default is 100, its cap 1000). */
  pageSize?: number | undefined
}

export interface HistoryOptions extends CallOptions {
  limit?: number | undefined
}

export interface RegisterOptions {
  name: string
  framework?: string | undefined
  /** Register another agent of this name; by default a name this token registered before
   * finds that agent (with a new key). */
  new?: boolean | undefined
  namespace?: string | undefined
  signal?: AbortSignal | undefined
}

/** `/v1/namespaces/{ns}/memory/{key}`, each segment percent-encoded. Keys with empty, `.` or
 * `..` segments are refused here: URL normalisation would turn them into another path. */
function entryPath(kind: 'memory' | 'history', namespace: string, key: string): string {
  const segments = key.split('/')
  if (key === '' || segments.some((s) => s === '' || s === '.' || s === '..')) {
    throw new InvalidRequestError(
      `key ${JSON.stringify(key)} has an empty, '.' or '..' segment (refused by the SDK)`,
      { code: 'invalid_key', status: 400, details: { key } },
    )
  }
  return `${namespacePath(namespace)}/${kind}/${segments.map(encodeURIComponent).join('/')}`
}

function millis(timestamp: number | Date | undefined): number | undefined {
  return timestamp instanceof Date ? timestamp.getTime() : timestamp
}

function entryOf<T>(reply: Reply): Entry<T> {
  if (reply.status === 202) throw new ApprovalPendingError(reply.body as Proposal)
  return toEntry<T>(reply.body as WireEntry, parseWarnings(reply.headers.get('memp-warning')))
}

/** Memory operations on the client's namespace (or the `namespace` given per call). */
export class Memory {
  constructor(
    private readonly transport: Transport,
    private readonly client: MEMP,
  ) {}

  /** Store `value` under `key`; resolves to the entry written (with `warnings`). */
  async put<T = any>(key: string, value: T, options: PutOptions = {}): Promise<Entry<T>> {
    const namespace = this.client.requireNamespace(options.namespace)
    const body: Record<string, unknown> = { value }
    if (options.ttlSeconds != null) body['ttl_seconds'] = options.ttlSeconds
    if (options.baseVersion != null) body['base_version'] = options.baseVersion
    if (options.timestamp != null) body['timestamp'] = millis(options.timestamp)
    if (options.approvalRequired) body['approval_required'] = true
    const headers: Record<string, string> = { 'Idempotency-Key': messageId() }
    if (options.ifVersion != null) headers['If-Match'] = `"${options.ifVersion}"`
    if (options.ifAbsent) headers['If-None-Match'] = '*'
    const reply = await this.transport.send({
      method: 'PUT',
      path: entryPath('memory', namespace, key),
      headers,
      body,
      idempotent: true,
      signal: options.signal,
    })
    return entryOf<T>(reply)
  }

  /** The value under `key` (NotFoundError when there is none). */
  async get<T = any>(key: string, options: CallOptions = {}): Promise<T> {
    return (await this.getEntry<T>(key, options)).value
  }

  /** The entry under `key`, with its version and metadata. */
  async getEntry<T = any>(key: string, options: CallOptions = {}): Promise<Entry<T>> {
    const namespace = this.client.requireNamespace(options.namespace)
    const reply = await this.transport.send({
      method: 'GET',
      path: entryPath('memory', namespace, key),
      idempotent: true,
      signal: options.signal,
    })
    return entryOf<T>(reply)
  }

  /**
   * Entries whose keys match `pattern` (`customer/*`, `*` for all). `await` it for every
   * matching entry, or `for await` over it to fetch page by page.
   */
  query<T = any>(pattern = '*', options: QueryOptions = {}): QueryResult<T> {
    const namespace = this.client.requireNamespace(options.namespace)
    return new QueryResult<T>(namespace, pattern, (cursor) =>
      this.page<T>(pattern, { namespace, cursor, limit: options.pageSize, signal: options.signal }),
    )
  }

  /** One page of a query, for callers that keep the cursor themselves. */
  async page<T = any>(pattern = '*', options: PageOptions = {}): Promise<Page<T>> {
    const namespace = this.client.requireNamespace(options.namespace)
    const reply = await this.transport.send({
      method: 'GET',
      path: `${namespacePath(namespace)}/memory`,
      query: { pattern, ...pageQuery(options) },
      idempotent: true,
      signal: options.signal,
    })
    const body = reply.body as { entries: WireEntry[]; next_cursor?: string | null }
    return {
      entries: body.entries.map((entry) => toEntry<T>(entry)),
      nextCursor: body.next_cursor ?? null,
    }
  }

  /** Delete `key`; resolves to the tombstone version. */
  async delete(key: string, options: DeleteOptions = {}): Promise<Entry<null>> {
    const namespace = this.client.requireNamespace(options.namespace)
    const headers: Record<string, string> = { 'Idempotency-Key': messageId() }
    if (options.ifVersion != null) headers['If-Match'] = `"${options.ifVersion}"`
    const reply = await this.transport.send({
      method: 'DELETE',
      path: entryPath('memory', namespace, key),
      query: {
        timestamp: millis(options.timestamp),
        approval_required: options.approvalRequired ? 'true' : undefined,
      },
      headers,
      idempotent: true,
      signal: options.signal,
    })
    return entryOf<null>(reply)
  }

  /** The key's recent versions, newest first, tombstones included. */
  async history<T = any>(key: string, options: HistoryOptions = {}): Promise<Entry<T | null>[]> {
    const namespace = this.client.requireNamespace(options.namespace)
    const reply = await this.transport.send({
      method: 'GET',
      path: entryPath('history', namespace, key),
      query: { limit: options.limit },
      idempotent: true,
      signal: options.signal,
    })
    return (reply.body as { versions: WireEntry[] }).versions.map((entry) => toEntry(entry))
  }
}

/** API-key management (needs a token with `admin` on every namespace it grants). */
export class Keys {
  constructor(private readonly transport: Transport) {}

  async create(options: {
    grants: Grant[]
    name?: string | undefined
    agentId?: string | undefined
    signal?: AbortSignal | undefined
  }): Promise<CreatedKey> {
    const body: Record<string, unknown> = { grants: options.grants, name: options.name ?? '' }
    if (options.agentId !== undefined) body['agent_id'] = options.agentId
    const reply = await this.transport.send({
      method: 'POST',
      path: '/v1/keys',
      body,
      idempotent: false,
      signal: options.signal,
    })
    const created = reply.body as { api_key: string; key: WireApiKey }
    return { apiKey: created.api_key, key: toApiKey(created.key) }
  }

  async list(options: { signal?: AbortSignal | undefined } = {}): Promise<ApiKey[]> {
    const reply = await this.transport.send({
      method: 'GET',
      path: '/v1/keys',
      idempotent: true,
      signal: options.signal,
    })
    return (reply.body as { keys: WireApiKey[] }).keys.map(toApiKey)
  }

  async revoke(keyId: string, options: { signal?: AbortSignal | undefined } = {}): Promise<void> {
    await this.transport.send({
      method: 'DELETE',
      path: `/v1/keys/${encodeURIComponent(keyId)}`,
      idempotent: false,
      signal: options.signal,
    })
  }
}

/**
 * A MEMP broker client. Options win over MEMP_API_KEY, MEMP_NAMESPACE and MEMP_BASE_URL (read
 * where there is a `process.env`); the base URL defaults to http://127.0.0.1:8080.
 */
export class MEMP {
  readonly config: Config
  readonly memory: Memory
  readonly keys: Keys
  readonly namespaces: Namespaces
  readonly schemas: Schemas
  readonly agents: Agents
  readonly messages: Messages
  readonly proposals: Proposals
  readonly audit: Audit
  readonly amp: Amp
  /** The agent registered with `register()`. */
  agent: Agent | null = null
  /** The credentials `register()` returned; the API key is shown only once. */
  credentials: Credentials | null = null
  readonly #transport: Transport
  readonly #subscriptions = new Set<Subscription>()

  constructor(options: MempOptions = {}) {
    this.config = resolveConfig(options)
    this.#transport = new Transport(this.config)
    this.memory = new Memory(this.#transport, this)
    this.keys = new Keys(this.#transport)
    this.namespaces = new Namespaces(this.#transport, this)
    this.schemas = new Schemas(this.#transport, this)
    this.agents = new Agents(this.#transport, this)
    this.messages = new Messages(this.#transport, this)
    this.proposals = new Proposals(this.#transport, this)
    this.audit = new Audit(this.#transport, this)
    this.amp = new Amp(this.#transport, this)
  }

  get namespace(): string | null {
    return this.config.namespace
  }

  /** The token in use (the agent's own key after `register`). */
  get apiKey(): string | null {
    return this.config.apiKey
  }

  /** @internal */
  requireNamespace(namespace?: string): string {
    const chosen = namespace || this.config.namespace
    if (!chosen) throw new TypeError('no namespace: pass { namespace } or set MEMP_NAMESPACE')
    return chosen
  }

  /** Register an agent; later calls use the API key bound to it (`agent`, `credentials`). */
  async register(options: RegisterOptions): Promise<Agent> {
    const namespace = this.requireNamespace(options.namespace)
    const reply = await this.#transport.send({
      method: 'POST',
      path: '/v1/agents',
      body: {
        name: options.name,
        framework: options.framework ?? 'custom',
        namespace,
        ...(options.new ? { new: true } : {}),
      },
      headers: { 'Idempotency-Key': messageId() },
      idempotent: true,
      signal: options.signal,
    })
    const body = reply.body as { agent: WireAgent; credentials: WireCredentials }
    this.agent = toAgent(body.agent)
    this.credentials = toCredentials(body.credentials)
    this.config.apiKey = this.credentials.apiKey
    return this.agent
  }

  /**
   * Events for keys matching `pattern` (or several patterns), live, as an async iterable that
   * reconnects with backoff and resumes from the last event id by itself.
   */
  subscribe<T = any>(
    pattern: string | string[] = '*',
    options: SubscribeOptions = {},
  ): Subscription<T> {
    const namespace = this.requireNamespace(options.namespace)
    const patterns = typeof pattern === 'string' ? [pattern] : [...pattern]
    const state = new StreamState(
      namespace,
      patterns,
      options.snapshot ?? false,
      options.lastEventId ?? null,
      options.onState,
      streamOptions(options),
    )
    const open = this.#subscriptions
    let subscription: Subscription<T> | undefined = undefined
    subscription = new Subscription<T>(this.#transport, state, options.signal, () => {
      if (subscription) open.delete(subscription)
    })
    if (!subscription.closed) open.add(subscription)
    return subscription
  }

  /** End every open subscription of this client. */
  close(): void {
    for (const subscription of [...this.#subscriptions]) subscription.close()
  }
}
