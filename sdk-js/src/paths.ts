/** Where a call goes: the client's scope (its namespace and agent), the path of a namespace's
 * resource, and the query of a paged listing. */

import { InvalidRequestError } from './errors.js'
import type { Agent } from './models.js'
import type { CallOptions } from './transport.js'

/** What the client's APIs (`agents`, `namespaces`, `proposals`, `amp`, ...) read from it. */
export interface ClientScope {
  readonly namespace: string | null
  readonly agent: Agent | null
  /** The namespace a call is for: the one given, else the client's; throws if neither. */
  requireNamespace(namespace?: string): string
}

/** A page of a listing: pass the last page's next cursor back as `cursor`. */
export interface PageOptions extends CallOptions {
  cursor?: string | null | undefined
  limit?: number | undefined
}

/** `/v1/namespaces/{namespace}/{rest...}`, each segment percent-encoded. A namespace that URL
 * normalisation would turn into another path (`.`, `..`, one with `/`) is refused here. */
export function namespacePath(namespace: string, ...rest: string[]): string {
  if (namespace === '.' || namespace === '..' || namespace.includes('/')) {
    throw new InvalidRequestError(`namespace ${JSON.stringify(namespace)} is not a namespace`, {
      code: 'invalid_namespace',
      status: 400,
      details: { namespace },
    })
  }
  return ['/v1/namespaces', namespace, ...rest].map((p, i) => (i ? encodeURIComponent(p) : p)).join('/')
}

/** The paging part of a listing's query. */
export function pageQuery(options: PageOptions): { cursor: string | undefined; limit: number | undefined } {
  return { cursor: options.cursor ?? undefined, limit: options.limit }
}
