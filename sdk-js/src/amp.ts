/**
 * The AMP bridge (`client.amp`): memory cells with decay, a lifecycle, access policies and
 * search. Cells keep the AMP spec's field names (snake_case). Calls act as the client's
 * registered agent (`X-AMP-Agent-ID`), else as the token's own; `agent` names another (a
 * gateway with the `impersonate` permission).
 */

import type { ClientScope } from './resources.js'
import type { Transport } from './transport.js'

export type MemoryType = 'episodic' | 'semantic' | 'procedural'
export type OwnerType = 'user' | 'agent' | 'organization'
export type CellStatus = 'active' | 'stale' | 'archived' | 'deleted'

export interface AccessPolicy {
  readable_by?: string[]
  writable_by?: string[]
  public?: boolean
}

export interface Provenance {
  source_type?: string | null
  source_ref?: string | null
  extraction_method?: string | null
}

/** An AMP memory cell (AMP spec section 1); times are ISO 8601 strings. */
/** A cell of the same owner whose text means nearly what a new cell's does. */
export interface NearDuplicate {
  id: string
  similarity: number
}

/** A create's reply: the cell as stored, and its near duplicates (null when not computed). */
export interface CreatedCell extends MemoryCell {
  near_duplicates: NearDuplicate[] | null
}

export interface MemoryCell {
  id: string
  amp_version: string
  type: MemoryType
  content: { text: string; metadata: Record<string, unknown> }
  identity: {
    owner_id: string
    owner_type: OwnerType
    created_by: string | null
    session_id: string | null
  }
  scoring: { importance: number; confidence: number; decay_rate: number; access_count: number }
  lifecycle: {
    created_at: string | null
    last_accessed_at: string | null
    last_updated_at: string | null
    expires_at: string | null
    status: CellStatus
    stale_since: string | null
    deleted_at: string | null
  }
  access_policy: Required<AccessPolicy>
  provenance: Provenance
}

export interface CellHit {
  cell: MemoryCell
  score: number
  decayScore: number
}

export interface CellSearchPage {
  results: CellHit[]
  nextCursor: string | null
  /** `embedder_unavailable` when a hybrid search could rank by words alone. */
  degraded?: string
}

/** How relevance is judged: by meaning and words, by meaning alone, or by shared words. */
export type SearchMode = 'hybrid' | 'semantic' | 'keyword'

export interface ImportResult {
  imported: number
  errors: { index: number; id: string | null; error: { code: string; message: string } }[]
}

interface Acting {
  /** Act as this agent instead of the client's. */
  agent?: string | undefined
  signal?: AbortSignal | undefined
}

export interface NewCellOptions extends Acting {
  ownerId: string
  ownerType?: OwnerType | undefined
  type?: MemoryType | undefined
  metadata?: Record<string, unknown> | undefined
  importance?: number | undefined
  confidence?: number | undefined
  decayRate?: number | undefined
  accessPolicy?: AccessPolicy | undefined
  provenance?: Provenance | undefined
  sessionId?: string | undefined
  expiresAt?: string | Date | undefined
}

export interface CellPatchOptions extends Acting {
  text?: string | undefined
  metadata?: Record<string, unknown> | undefined
  importance?: number | undefined
  confidence?: number | undefined
  decayRate?: number | undefined
  accessPolicy?: AccessPolicy | undefined
  expiresAt?: string | Date | undefined
}

export interface CellMergeOptions extends Acting {
  /** The merged cell's type; by default the sources' when they share one, else `semantic`. */
  type?: MemoryType | undefined
  metadata?: Record<string, unknown> | undefined
  importance?: number | undefined
  confidence?: number | undefined
  decayRate?: number | undefined
  accessPolicy?: AccessPolicy | undefined
}

export interface CellSearchOptions extends Acting {
  query?: string | undefined
  ownerId?: string | undefined
  ownerType?: OwnerType | undefined
  types?: MemoryType[] | undefined
  status?: CellStatus[] | undefined
  includeStale?: boolean | undefined
  metadata?: Record<string, unknown> | undefined
  createdAfter?: string | Date | undefined
  createdBefore?: string | Date | undefined
  limit?: number | undefined
  cursor?: string | undefined
  /** `hybrid` (the broker's default when it has an embedder), `semantic` or `keyword`. */
  mode?: SearchMode | undefined
  /** Leave out matches less relevant than this (0 to 1). */
  minScore?: number | undefined
}

function iso(moment: string | Date | undefined): string | undefined {
  return moment instanceof Date ? moment.toISOString() : moment
}

/** The object without its undefined fields (and undefined when that leaves nothing). */
function defined(fields: Record<string, unknown>): Record<string, unknown> | undefined {
  const kept = Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined))
  return Object.keys(kept).length ? kept : undefined
}

/** AMP memory cells. */
export class Amp {
  constructor(
    private readonly transport: Transport,
    private readonly client: ClientScope,
  ) {}

  private headers(agent: string | undefined): Record<string, string> {
    const acting = agent ?? this.client.agent?.id
    return acting ? { 'X-AMP-Agent-ID': acting } : {}
  }

  private async call<T>(
    method: 'GET' | 'POST' | 'PATCH' | 'DELETE',
    path: string,
    options: Acting,
    body?: unknown,
    idempotent = false,
  ): Promise<T> {
    const reply = await this.transport.send({
      method,
      path,
      body,
      headers: this.headers(options.agent),
      idempotent,
      signal: options.signal,
    })
    return reply.body as T
  }

  /**
   * Create a cell; the broker sets its id, creator (the acting agent) and lifecycle.
   * `near_duplicates` lists the owner's cells that say nearly the same, to `merge` with.
   */
  async create(text: string, options: NewCellOptions): Promise<CreatedCell> {
    const body = defined({
      type: options.type ?? 'semantic',
      content: { text, metadata: options.metadata ?? {} },
      identity: defined({
        owner_id: options.ownerId,
        owner_type: options.ownerType ?? 'user',
        session_id: options.sessionId,
      }),
      scoring: defined({
        importance: options.importance,
        confidence: options.confidence,
        decay_rate: options.decayRate,
      }),
      access_policy: options.accessPolicy,
      provenance: options.provenance,
      expires_at: iso(options.expiresAt),
    })
    return this.call('POST', '/amp/memories', options, body)
  }

  /** Read a cell (a read counts as an access and restarts its decay). */
  async get(id: string, options: Acting = {}): Promise<MemoryCell> {
    return this.call('GET', `/amp/memories/${encodeURIComponent(id)}`, options, undefined, true)
  }

  /** Change what is given; an archived cell refuses (ConflictError, `cellStatus`). */
  async patch(id: string, options: CellPatchOptions): Promise<MemoryCell> {
    const body =
      defined({
        content: defined({ text: options.text, metadata: options.metadata }),
        scoring: defined({
          importance: options.importance,
          confidence: options.confidence,
          decay_rate: options.decayRate,
        }),
        access_policy: options.accessPolicy,
        expires_at: iso(options.expiresAt),
      }) ?? {}
    return this.call('PATCH', `/amp/memories/${encodeURIComponent(id)}`, options, body)
  }

  /** Soft-delete an archived cell (others: ConflictError naming their status). */
  async delete(id: string, options: Acting = {}): Promise<MemoryCell> {
    return this.call('DELETE', `/amp/memories/${encodeURIComponent(id)}`, options)
  }

  /** Cells the acting agent may read, best first; pass `nextCursor` back as `cursor`. */
  async search(options: CellSearchOptions = {}): Promise<CellSearchPage> {
    const body =
      defined({
        query: options.query,
        owner_id: options.ownerId,
        owner_type: options.ownerType,
        types: options.types,
        status: options.status,
        include_stale: options.includeStale || undefined,
        metadata: options.metadata,
        created_after: iso(options.createdAfter),
        created_before: iso(options.createdBefore),
        limit: options.limit,
        cursor: options.cursor,
        mode: options.mode,
        min_score: options.minScore,
      }) ?? {}
    const page = await this.call<{
      results: { cell: MemoryCell; score: number; decay_score: number }[]
      next_cursor?: string | null
      degraded?: string
    }>('POST', '/amp/memories/search', options, body, true)
    const found: CellSearchPage = {
      results: page.results.map((hit) => ({
        cell: hit.cell,
        score: hit.score,
        decayScore: hit.decay_score,
      })),
      nextCursor: page.next_cursor ?? null,
    }
    if (page.degraded !== undefined) found.degraded = page.degraded
    return found
  }

  /**
   * One new cell of the sources' owner from 2 to 50 cells the agent may write, which become
   * archived; its provenance names them. A source already archived (another merge won)
   * rejects with ConflictError.
   */
  async merge(ids: string[], text: string, options: CellMergeOptions = {}): Promise<MemoryCell> {
    const body = defined({
      ids,
      text,
      type: options.type,
      metadata: options.metadata,
      scoring: defined({
        importance: options.importance,
        confidence: options.confidence,
        decay_rate: options.decayRate,
      }),
      access_policy: options.accessPolicy,
    })
    return this.call('POST', '/amp/memories/merge', options, body)
  }

  /** Store cells from another system as they are (needs `admin` on the AMP namespace). */
  async importCells(cells: MemoryCell[], options: Acting = {}): Promise<ImportResult> {
    // A create's reply (CreatedCell) is sent as the cell alone: an import takes cells only.
    const plain = cells.map((cell) => {
      const { near_duplicates: _, ...rest } = cell as Partial<CreatedCell>
      return rest
    })
    return this.call('POST', '/amp/import', options, { cells: plain })
  }
}
