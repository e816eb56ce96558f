/**
 * Subscriptions: Server-Sent Events read with fetch, reconnecting with backoff and resuming
 * from the last event id.
 *
 * The broker's event ids are resume cursors: reconnecting with `Last-Event-ID` replays every
 * change after it exactly once, so a stream that breaks (broker restart, network, `overflow`,
 * `shutdown`) resumes without a gap or a duplicate. `reset` is passed on to the caller. After
 * `revoked` the reconnect is refused (401 or 403), and that error ends the subscription.
 */

import { createParser, type EventSourceMessage } from 'eventsource-parser'

import { ConnectionFailedError, errorFromReply, MempError, OpenTimeoutError } from './errors.js'
import {
  END_EVENT_TYPES,
  toEntry,
  type EventType,
  type MempEvent,
  type WireEntry,
} from './models.js'
import {
  certificateError,
  corsRefusal,
  link,
  parseJson,
  sleep,
  type Transport,
} from './transport.js'

export interface SubscribeOptions {
  /** Start with the current matching entries (`snapshot` events), then `snapshot-end`. */
  snapshot?: boolean | undefined
  /** Follow this namespace instead of the client's. */
  namespace?: string | undefined
  /** Ends the subscription when it aborts: the `for await` loop simply finishes. */
  signal?: AbortSignal | undefined
  /** Resume after this cursor (a `MempEvent.id` or `Subscription.lastEventId` kept earlier). */
  lastEventId?: string | undefined
  /** Called with each change of the connection's state (see `ConnectionState`). */
  onState?: ((state: ConnectionState) => void) | undefined
  /** Only changes this expression accepts, e.g. `/status == "done"` (docs/subscriptions.md).
   * Changes it leaves out still move `lastEventId`. */
  filter?: string | undefined
  /** `latest`: while the stream lags, the broker sends only the newest change per key. */
  conflate?: 'latest' | undefined
  /** At most this many changes a second; the broker conflates the rest by key. */
  maxRate?: number | undefined
}

/** The query parameters fitting a stream to its consumer: filter, conflate, max_rate. */
export function streamOptions(options: SubscribeOptions): [string, string][] {
  const found: [string, string][] = []
  if (options.filter) found.push(['filter', options.filter])
  if (options.conflate !== undefined) found.push(['conflate', options.conflate])
  if (options.maxRate !== undefined) found.push(['max_rate', String(options.maxRate)])
  return found
}

/**
 * Where a subscription's connection stands: `connecting` (the first attempt), `connected` (the
 * stream is open), `reconnecting` (after a break: `attempt` counts the tries since the last
 * success, `error` says what broke), `closed` (for good: `error` is why, or null after
 * `close()`).
 */
export interface ConnectionState {
  status: 'connecting' | 'connected' | 'reconnecting' | 'closed'
  attempt: number
  error: unknown
}

const ENTRY_EVENTS = new Set(['put', 'delete', 'expire', 'snapshot'])
const RESUME_EVENTS = new Set<string>(END_EVENT_TYPES)
const OPENED = Symbol('opened')

interface Marker {
  cursor?: string
  namespace?: string
  reason?: string
}

/** What a subscription follows and how far it got; turns SSE messages into events. */
export class StreamState {
  cursor: string | null
  snapshotPending: boolean
  /** Snapshot entries handed out, so a snapshot asked for again after a break skips them. */
  readonly snapshotSent = new Set<string>()
  /** Connection attempts in a row that delivered nothing. */
  failures = 0
  /** Reconnection attempts since the last event (the first is 1). */
  retries = 0
  /** This connection delivered an event. */
  live = false
  /** The broker ended the stream and asked to be resumed. */
  resumeNow = false
  /** Connection attempts made so far. */
  attempts = 0
  /** Streams opened so far. */
  connections = 0
  /** What ended the last attempt. */
  error: unknown = null
  status: ConnectionState['status'] | null = null

  constructor(
    readonly namespace: string,
    readonly patterns: string[],
    snapshot: boolean,
    lastEventId: string | null,
    readonly onState?: ((state: ConnectionState) => void) | undefined,
    readonly options: [string, string][] = [],
  ) {
    this.cursor = lastEventId || null
    this.snapshotPending = snapshot && this.cursor === null
  }

  query(): URLSearchParams {
    this.live = false
    this.attempts += 1
    const params = new URLSearchParams({ namespace: this.namespace })
    for (const pattern of this.patterns) params.append('pattern', pattern)
    if (this.snapshotPending) params.append('snapshot', '1')
    for (const [name, value] of this.options) params.append(name, value)
    return params
  }

  headers(): Record<string, string> {
    const headers: Record<string, string> = { Accept: 'text/event-stream' }
    if (this.cursor !== null) headers['Last-Event-ID'] = this.cursor
    return headers
  }

  /** The connection closed or failed. */
  ended(): void {
    if (!this.live) this.failures += 1
  }

  /** Tell the listener where the connection stands (each change once). */
  report(status: ConnectionState['status'], error: unknown = null): void {
    if (status === this.status && status !== 'reconnecting') return
    this.status = status
    const attempt = status === 'reconnecting' ? this.retries : 0
    try {
      this.onState?.({ status, attempt, error })
    } catch {
      // a listener's failure is its own; the stream goes on
    }
  }

  attempting(): void {
    const first = this.connections === 0 && this.failures === 0
    if (!first) this.retries += 1
    this.report(first ? 'connecting' : 'reconnecting', first ? null : this.error)
  }

  /** No wait after a stream that worked or asked to be resumed; backoff after failures. */
  delay(transport: Transport): number {
    if (this.resumeNow || this.failures === 0) {
      this.resumeNow = false
      return 0
    }
    return transport.delay(this.failures - 1)
  }

  /** The event to hand out for one message, or null (resume markers, snapshot entries already
   * handed out before a reconnect, event types this SDK does not know). */
  handle(message: EventSourceMessage): MempEvent | null {
    const kind = message.event
    if (!kind) return null
    this.live = true
    this.failures = 0
    this.retries = 0
    if (message.id) this.cursor = message.id // `progress` too: changes a filter left out
    if (ENTRY_EVENTS.has(kind)) {
      const entry = toEntry(decode<WireEntry>(message.data, kind))
      if (kind !== 'snapshot') return event(kind as EventType, this.cursor, entry.namespace, entry)
      const seen = `${entry.namespace}\u0000${entry.key}\u0000${entry.version}`
      if (this.snapshotSent.has(seen)) return null
      this.snapshotSent.add(seen)
      return event('snapshot', null, entry.namespace, entry)
    }
    if (kind !== 'snapshot-end' && kind !== 'reset' && !RESUME_EVENTS.has(kind)) return null
    const marker = message.data ? decode<Marker>(message.data, kind) : {}
    if (marker.cursor) this.cursor = marker.cursor
    if (RESUME_EVENTS.has(kind)) {
      this.resumeNow = true
      return null
    }
    if (kind === 'snapshot-end') {
      this.snapshotPending = false
      this.snapshotSent.clear()
      return event('snapshot-end', this.cursor, null, null)
    }
    return event('reset', this.cursor, marker.namespace ?? null, null, marker.reason ?? null)
  }
}

function event(
  type: EventType,
  id: string | null,
  namespace: string | null,
  entry: MempEvent['entry'],
  reason: string | null = null,
): MempEvent {
  return {
    type,
    id,
    namespace,
    entry,
    key: entry?.key ?? null,
    value: entry?.value ?? null,
    version: entry?.version ?? null,
    reason,
    warnings: entry?.warnings ?? [],
  }
}

function decode<T>(data: string, kind: string): T {
  try {
    return JSON.parse(data) as T
  } catch (error) {
    throw new MempError(`the broker sent a ${kind} event that is not JSON`, {
      code: 'invalid_event',
      cause: error,
    })
  }
}

/** Refusals that reconnecting cannot fix (4xx) end the subscription with their error; server
 * trouble (5xx, 503 while Redis is away) and 408/429 are retried with backoff. */
function fatal(status: number): boolean {
  return status < 500 && status !== 408 && status !== 429
}

/**
 * An endless async iterator of events: `for await (const event of broker.subscribe('x/*'))`.
 * It connects when iteration starts (or at `open()`); `break`, `close()` or the `signal` ends
 * it, and then the loop simply finishes.
 */
export class Subscription<T = any> implements AsyncIterableIterator<MempEvent<T>> {
  readonly #transport: Transport
  readonly #state: StreamState
  readonly #stop = new AbortController()
  readonly #items: AsyncGenerator<MempEvent<T> | typeof OPENED, void, undefined>
  readonly #onClose: () => void
  #unlinkSignal: () => void = () => {}
  #opened = false

  /** Made by `MEMP.subscribe`. */
  constructor(transport: Transport, state: StreamState, signal?: AbortSignal, onClose = () => {}) {
    this.#transport = transport
    this.#state = state
    this.#onClose = onClose
    this.#items = this.#run()
    if (signal) {
      const close = (): void => this.close()
      if (signal.aborted) close()
      else {
        signal.addEventListener('abort', close, { once: true })
        this.#unlinkSignal = () => signal.removeEventListener('abort', close)
      }
    }
  }

  /** The cursor to resume from: pass it as `lastEventId` to a later subscribe. */
  get lastEventId(): string | null {
    return this.#state.cursor
  }

  /** Connection attempts made so far (1 while the first connection holds). */
  get attempts(): number {
    return this.#state.attempts
  }

  get closed(): boolean {
    return this.#stop.signal.aborted
  }

  /**
   * Connect now (retrying with backoff while the broker is unreachable) and resolve once the
   * stream is open: every change made after that is delivered. Call it before iterating.
   */
  async open(options: { timeout?: number } = {}): Promise<this> {
    if (!this.#opened) {
      let timer: ReturnType<typeof setTimeout> | undefined
      const pending = this.#items.next()
      const expired = new Promise<'expired'>((resolve) => {
        if (options.timeout !== undefined) timer = setTimeout(() => resolve('expired'), options.timeout)
      })
      let item: IteratorResult<MempEvent<T> | typeof OPENED, void> | 'expired'
      try {
        item = await Promise.race([pending, expired])
      } catch (error) {
        this.close()
        throw error
      } finally {
        clearTimeout(timer)
      }
      if (item === 'expired') {
        const last = this.#state.error
        const error = new OpenTimeoutError(
          `the event stream at ${this.#transport.config.baseUrl} did not open within ` +
            `${options.timeout} ms` + (last ? `: ${describeError(last)}` : ''),
          { code: 'connection_error', cause: last ?? undefined },
        )
        this.#state.report('closed', error)
        this.close()
        pending.catch(() => {})
        throw error
      }
      if (!item.done && item.value !== OPENED) {
        throw new Error('open() must be called before the subscription is iterated')
      }
      if (item.done) throw new ConnectionFailedError('the subscription was closed before it opened', { code: 'connection_error' })
      this.#opened = true
    }
    return this
  }

  async next(): Promise<IteratorResult<MempEvent<T>, undefined>> {
    for (;;) {
      let item: IteratorResult<MempEvent<T> | typeof OPENED, void>
      try {
        item = await this.#items.next()
      } catch (error) {
        this.close()
        throw error
      }
      if (item.done) {
        this.close()
        return { done: true, value: undefined }
      }
      if (item.value === OPENED) {
        this.#opened = true
        continue
      }
      return { done: false, value: item.value }
    }
  }

  /** What `break` calls: ends the subscription. */
  async return(): Promise<IteratorResult<MempEvent<T>, undefined>> {
    this.close()
    await this.#items.return(undefined).catch(() => {})
    return { done: true, value: undefined }
  }

  [Symbol.asyncIterator](): this {
    return this
  }

  /** End the subscription: the connection is closed and a pending `next()` finishes. */
  close(): void {
    if (this.#stop.signal.aborted) return
    this.#stop.abort()
    this.#unlinkSignal()
    this.#onClose()
    // Run the generator's cleanup now if it is parked at a `yield` (after a pending `next()`
    // otherwise, which the abort above ends).
    this.#items.return(undefined).catch(() => {})
  }

  async *#run(): AsyncGenerator<MempEvent<T> | typeof OPENED, void, undefined> {
    const transport = this.#transport
    const config = transport.config
    const state = this.#state
    const stop = this.#stop.signal
    try {
      yield* this.#connections(transport, config, state, stop)
    } catch (error) {
      state.report('closed', error)
      throw error
    } finally {
      state.report('closed', null)
    }
  }

  async *#connections(
    transport: Transport,
    config: Transport['config'],
    state: StreamState,
    stop: AbortSignal,
  ): AsyncGenerator<MempEvent<T> | typeof OPENED, void, undefined> {
    while (!stop.aborted) {
      state.attempting()
      const connection = new AbortController()
      const unlink = link(stop, connection)
      let timer: ReturnType<typeof setTimeout> | undefined
      // No byte for `streamTimeout` ms (the broker sends a heartbeat every 15 s): a dead peer.
      const arm = (): void => {
        clearTimeout(timer)
        timer = setTimeout(
          () => connection.abort(new DOMException('the stream went silent', 'TimeoutError')),
          config.streamTimeout,
        )
      }
      let reader: ReadableStreamDefaultReader<Uint8Array> | undefined
      try {
        arm()
        const response = await config.fetch(transport.url('/v1/subscribe', state.query()), {
          headers: transport.headers(state.headers()),
          signal: connection.signal,
          cache: 'no-store',
        })
        if (response.status !== 200) {
          const text = await response.text()
          const refusal = errorFromReply(response.status, response.statusText, parseJson(text),
            response.headers)
          if (fatal(response.status)) throw refusal
          state.error = refusal
        } else if (!response.body || !isEventStream(response)) {
          throw new ConnectionFailedError(
            `${config.baseUrl} did not answer with an event stream`,
            { code: 'connection_error', status: response.status },
          )
        } else {
          reader = response.body.getReader()
          const decoder = new TextDecoder()
          const messages: EventSourceMessage[] = []
          const parser = createParser({ onEvent: (message) => messages.push(message) })
          let opened = false
          for (;;) {
            arm()
            const { done, value } = await reader.read()
            if (done) break
            if (!opened) {
              opened = true
              state.connections += 1
              state.report('connected')
              yield OPENED
            }
            parser.feed(decoder.decode(value, { stream: true }))
            while (messages.length > 0) {
              const item = state.handle(messages.shift()!)
              if (item !== null) yield item as MempEvent<T>
              if (stop.aborted) return
            }
          }
          state.error = new ConnectionFailedError('the broker ended the stream', {
            code: 'connection_error',
          })
        }
      } catch (error) {
        if (stop.aborted) return
        if (error instanceof MempError) throw error
        // A certificate that cannot be verified, or a page origin the broker's CORS policy
        // refuses, would be refused on every reconnect.
        const refused = certificateError(error, config) ?? (await corsRefusal(error, config))
        if (refused) throw refused
        // Network trouble (refused, reset, the broker went away, silence): reconnect.
        state.error = error
      } finally {
        clearTimeout(timer)
        unlink()
        connection.abort()
        reader?.cancel().catch(() => {})
      }
      state.ended()
      try {
        await sleep(state.delay(transport), stop)
      } catch {
        return
      }
    }
  }
}

function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error)
  const cause = (error as { cause?: unknown }).cause
  return cause instanceof Error ? `${error.message} (${cause.message})` : error.message
}

function isEventStream(response: Response): boolean {
  return (response.headers.get('content-type') ?? '').startsWith('text/event-stream')
}
