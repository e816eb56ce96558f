/** Query results: awaitable for every matching entry, async-iterable page by page. */

import type { Entry, Page } from './models.js'

/**
 * The entries whose keys match a pattern. Nothing is sent until it is awaited or iterated.
 *
 * - `await result` gives every matching entry (all pages, fetched once and kept).
 * - `for await (const entry of result)` fetches page after page only as far as you iterate,
 *   keeping nothing, so it walks a namespace of any size; each iteration starts afresh.
 * - `result.pages()` iterates the pages themselves.
 */
export class QueryResult<T = any> implements AsyncIterable<Entry<T>>, PromiseLike<Entry<T>[]> {
  #all: Promise<Entry<T>[]> | null = null

  constructor(
    readonly namespace: string,
    readonly pattern: string,
    private readonly fetchPage: (cursor: string | null) => Promise<Page<T>>,
  ) {}

  /** Every page, following `nextCursor` until the broker says there is no more. */
  async *pages(): AsyncGenerator<Page<T>, void, undefined> {
    let cursor: string | null = null
    do {
      const page: Page<T> = await this.fetchPage(cursor)
      yield page
      cursor = page.nextCursor
    } while (cursor !== null)
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Entry<T>, void, undefined> {
    for await (const page of this.pages()) yield* page.entries
  }

  /** Every matching entry, in key order (fetches every page once; later calls reuse it). */
  toArray(): Promise<Entry<T>[]> {
    if (this.#all === null) {
      this.#all = (async () => {
        const entries: Entry<T>[] = []
        for await (const page of this.pages()) entries.push(...page.entries)
        return entries
      })()
      this.#all.catch(() => {
        this.#all = null // a failed fetch may be tried again
      })
    }
    return this.#all
  }

  /** Key → value for every matching entry. */
  async values(): Promise<Record<string, T>> {
    const values: Record<string, T> = {}
    for (const entry of await this.toArray()) values[entry.key] = entry.value
    return values
  }

  then<R1 = Entry<T>[], R2 = never>(
    onfulfilled?: ((entries: Entry<T>[]) => R1 | PromiseLike<R1>) | null,
    onrejected?: ((reason: unknown) => R2 | PromiseLike<R2>) | null,
  ): Promise<R1 | R2> {
    return this.toArray().then(onfulfilled, onrejected)
  }

  catch<R = never>(
    onrejected?: ((reason: unknown) => R | PromiseLike<R>) | null,
  ): Promise<Entry<T>[] | R> {
    return this.toArray().catch(onrejected)
  }
}
