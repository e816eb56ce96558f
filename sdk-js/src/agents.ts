/** Agents of a namespace (`client.agents`) and protocol message batches (`client.messages`). */

import { errorFromReply, type MempError } from './errors.js'
import {
  toAgent,
  toCredentials,
  toEntry,
  type Agent,
  type Credentials,
  type Entry,
  type WireAgent,
  type WireCredentials,
  type WireEntry,
} from './models.js'
import { getResource, namespacePath, pageQuery, type ClientScope, type PageOptions } from './resources.js'
import { messageId, type CallOptions, type Transport } from './transport.js'

/** One page of agents, in registration order; pass `nextCursor` back as `cursor`. */
export interface AgentPage {
  agents: Agent[]
  nextCursor: string | null
}

/** Agents registered in the client's namespace (reading needs `read`, removing `admin`). */
export class Agents {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  async get(agentId: string, options: CallOptions = {}): Promise<Agent> {
    return toAgent((await getResource(this.transport, this.client, options, ['agents', agentId])) as WireAgent)
  }

  async list(options: PageOptions = {}): Promise<AgentPage> {
    const body = (await getResource(this.transport, this.client, options, ['agents'], pageQuery(options))) as {
      agents: WireAgent[]
      next_cursor?: string | null
    }
    return { agents: body.agents.map(toAgent), nextCursor: body.next_cursor ?? null }
  }

  /** Remove an agent: its record goes and every key bound to it is revoked. */
  async remove(agentId: string, options: CallOptions = {}): Promise<void> {
    const namespace = this.client.requireNamespace(options.namespace)
    await this.transport.send({
      method: 'DELETE',
      path: namespacePath(namespace, 'agents', agentId),
      idempotent: false,
      signal: options.signal,
    })
  }
}

interface Common {
  /** The message id (default: a fresh one, so a resent batch is applied once). */
  id?: string | undefined
  /** Default: the client's namespace. */
  namespace?: string | undefined
  timestamp?: number | undefined
}

/** A protocol message, as `POST /v1/messages` takes it (field names as on the wire). */
export type Message =
  | (Common & { type: 'agent.register'; name: string; framework?: string })
  | (Common & { type: 'agent.get'; agent: string })
  | (Common & { type: 'agent.list'; cursor?: string | null; limit?: number })
  | (Common & {
      type: 'memory.put'
      key: string
      value: unknown
      ttl_seconds?: number | null
      if_version?: number
      if_absent?: boolean
      base_version?: number
    })
  | (Common & { type: 'memory.get'; key: string })
  | (Common & { type: 'memory.query'; pattern: string; cursor?: string | null; limit?: number })
  | (Common & { type: 'memory.delete'; key: string; if_version?: number })
  | (Common & { type: 'memory.history'; key: string; limit?: number })

/** A message's reply: `ack` (writes), `result` (reads) or `error`, with its payload. */
export interface MessageReply<T = any> {
  type: 'ack' | 'result' | 'error'
  id: string
  replyTo: string | null
  namespace: string | null
  entry: Entry<T> | null
  entries: Entry<T>[] | null
  nextCursor: string | null
  versions: Entry<T | null>[] | null
  agent: Agent | null
  credentials: Credentials | null
  agents: Agent[] | null
  warnings: string[]
  /** The typed error of an `error` reply (not thrown: the batch's other replies stand). */
  error: MempError | null
}

interface WireReply {
  type: 'ack' | 'result' | 'error'
  id: string
  reply_to?: string | null
  namespace?: string | null
  entry?: WireEntry
  entries?: WireEntry[]
  next_cursor?: string | null
  versions?: WireEntry[]
  agent?: WireAgent
  credentials?: WireCredentials
  agents?: WireAgent[]
  warnings?: string[]
  error?: { code: string; message: string; details?: Record<string, unknown> }
}

function toReply(wire: WireReply): MessageReply {
  return {
    type: wire.type,
    id: wire.id,
    replyTo: wire.reply_to ?? null,
    namespace: wire.namespace ?? null,
    entry: wire.entry ? toEntry(wire.entry, wire.warnings ?? []) : null,
    entries: wire.entries ? wire.entries.map((e) => toEntry(e)) : null,
    nextCursor: wire.next_cursor ?? null,
    versions: wire.versions ? wire.versions.map((e) => toEntry(e)) : null,
    agent: wire.agent ? toAgent(wire.agent) : null,
    credentials: wire.credentials ? toCredentials(wire.credentials) : null,
    agents: wire.agents ? wire.agents.map(toAgent) : null,
    warnings: wire.warnings ?? [],
    error: wire.error ? errorFromReply(0, '', { error: wire.error }) : null,
  }
}

/** MEMP protocol messages, `POST /v1/messages`. */
export class Messages {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  /** Run the messages in order, one reply each; an `error` reply does not stop the rest. */
  async batch(messages: Message[], options: { signal?: AbortSignal | undefined } = {}): Promise<MessageReply[]> {
    const namespace = this.client.namespace
    const body = messages.map((message) => ({
      memp: '1.0',
      ...message,
      namespace: message.namespace ?? namespace ?? undefined,
      id: message.id ?? messageId(),
    }))
    const reply = await this.transport.send({
      method: 'POST',
      path: '/v1/messages',
      body,
      idempotent: true,
      signal: options.signal,
    })
    return (reply.body as WireReply[]).map(toReply)
  }
}
