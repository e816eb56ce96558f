/**
 * Proposals, the approval-gated writes (`client.proposals`), and the hash-chained audit log
 * (`client.audit`); the broker's docs/governance.md. Field names are the broker's (snake_case).
 */

import { toEntry, type Entry, type WireEntry } from './models.js'
import { getResource, namespacePath, pageQuery, type ClientScope, type PageOptions } from './resources.js'
import type { CallOptions, Transport } from './transport.js'

export type ProposalStatus = 'pending' | 'approved' | 'rejected' | 'expired'

/** A gated write awaiting review (or decided); `diff` is an RFC 6902 patch from the value at
 * `base_version` to `value` (null for a delete). */
export interface Proposal {
  id: string
  status: ProposalStatus
  namespace: string
  key: string
  operation: 'put' | 'merge' | 'delete'
  value: any
  base_version: number
  proposed_by: string
  created_at: number
  expires_at: number
  diff: { op: 'add' | 'remove' | 'replace'; path: string; value?: any }[]
  ttl_seconds: number | null
  conflicts?: unknown[]
  decided_by: string | null
  decided_at: number | null
  reason: string | null
  /** The entry version an approval wrote. */
  version: number | null
}

export interface ProposalPage {
  proposals: Proposal[]
  next_cursor: string | null
}

/** What an approval did: the proposal, now approved, and the entry version it wrote. */
export interface Approval {
  proposal: Proposal
  entry: Entry
}

/** One audit record: who did what to which key, the versions before and after, a hash of the
 * content (never the content), and its link in the hash chain. */
export interface AuditRecord {
  id: string
  seq: number
  at: number
  action: string
  actor: string
  agent_id: string | null
  key_id: string | null
  key: string | null
  version_before: number | null
  version_after: number | null
  content_hash: string | null
  request_id: string | null
  details: Record<string, unknown>
  prev: string
  hash: string
}

export interface AuditPage {
  records: AuditRecord[]
  next_cursor: string | null
}

/** The hash chain walked: `broken` names the first bad record when `ok` is false. */
export interface AuditVerdict {
  ok: boolean
  records: number
  head: string
  broken: { id: string | null; seq: number; reason: string } | null
}

/** A time bound: Unix ms, a Date, or an ISO 8601 time with a zone. */
export type Bound = number | Date | string

export interface AuditFilter {
  since?: Bound | undefined
  until?: Bound | undefined
  actor?: string | undefined
  key?: string | undefined
  action?: string | undefined
  /** A record id (the newest one an earlier export returned): only records appended after it. */
  after?: string | undefined
}

function bound(value: Bound | undefined): string | number | undefined {
  return value instanceof Date ? value.getTime() : value
}

/** Gated writes of the client's namespace: holders of `review` see and decide all of them;
 * a writer sees its own. */
export class Proposals {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  /** One page, newest first; pass `next_cursor` back as `cursor`. */
  async list(
    options: PageOptions & { status?: ProposalStatus | undefined; key?: string | undefined } = {},
  ): Promise<ProposalPage> {
    const query = { status: options.status, key: options.key, ...pageQuery(options) }
    return (await getResource(this.transport, this.client, options, ['proposals'], query)) as ProposalPage
  }

  /** A proposal with its diff. */
  async get(proposalId: string, options: CallOptions = {}): Promise<Proposal> {
    return (await getResource(this.transport, this.client, options, ['proposals', proposalId])) as Proposal
  }

  /**
   * Write the proposal. If the key moved since, ConflictError's details carry `current`,
   * `current_version` and a fresh `diff`; approve again with `baseVersion` set to
   * `current_version` to apply it rebased.
   */
  async approve(
    proposalId: string,
    options: CallOptions & { baseVersion?: number | undefined } = {},
  ): Promise<Approval> {
    const namespace = this.client.requireNamespace(options.namespace)
    const reply = await this.transport.send({
      method: 'POST',
      path: namespacePath(namespace, 'proposals', proposalId, 'approve'),
      body: options.baseVersion == null ? {} : { base_version: options.baseVersion },
      idempotent: false,
      signal: options.signal,
    })
    const body = reply.body as { proposal: Proposal; entry: WireEntry }
    return { proposal: body.proposal, entry: toEntry(body.entry) }
  }

  /** Close the proposal for good, with a reason. */
  async reject(proposalId: string, reason = '', options: CallOptions = {}): Promise<Proposal> {
    const namespace = this.client.requireNamespace(options.namespace)
    const reply = await this.transport.send({
      method: 'POST',
      path: namespacePath(namespace, 'proposals', proposalId, 'reject'),
      body: { reason },
      idempotent: false,
      signal: options.signal,
    })
    return reply.body as Proposal
  }
}

/** The namespace's audit log; needs `audit` (or `admin`). */
export class Audit {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  /** One page, newest first; pass `next_cursor` back as `cursor`. */
  async list(
    options: PageOptions & AuditFilter = {},
  ): Promise<AuditPage> {
    const query = {
      since: bound(options.since),
      until: bound(options.until),
      actor: options.actor,
      key: options.key,
      action: options.action,
      after: options.after,
      ...pageQuery(options),
    }
    return (await getResource(this.transport, this.client, options, ['audit'], query)) as AuditPage
  }

  /** Every record of the selection, newest first, page after page. */
  async export(options: CallOptions & AuditFilter = {}): Promise<AuditRecord[]> {
    const records: AuditRecord[] = []
    let cursor: string | null = null
    do {
      const page: AuditPage = await this.list({ ...options, cursor, limit: 1000 })
      records.push(...page.records)
      cursor = page.next_cursor
    } while (cursor)
    return records
  }

  /** Walk the hash chain: `ok` is false, with `broken`, if a record was tampered with. */
  async verify(options: CallOptions = {}): Promise<AuditVerdict> {
    return (await getResource(this.transport, this.client, options, ['audit', 'verify'])) as AuditVerdict
  }
}
