/** Calls on a namespace's resources: the client's scope (its namespace and agent), their paths,
 * the query of a paged listing, and reading one. */

import { InvalidRequestError } from './errors.js'
import type { Agent } from './models.js'
import type { CallOptions, Transport } from './transport.js'

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

/** GET one of a namespace's resources (the call's namespace, else the client's): the reply's
 * body. */
export async function getResource(
  transport: Transport,
  scope: ClientScope,
  options: CallOptions,
  rest: string[],
  query?: Record<string, string | number | undefined>,
): Promise<unknown> {
  const reply = await transport.send({
    method: 'GET',
    path: namespacePath(scope.requireNamespace(options.namespace), ...rest),
    ...(query ? { query } : {}),
    idempotent: true,
    signal: options.signal,
  })
  return reply.body
}
