/**
 * Sending requests: the bearer token, timeouts, and retries with backoff.
 *
 * Retries resend the very same request, so a write keeps its Idempotency-Key and the broker
 * applies it once however often it arrives (docs/api.md, "Retries are safe"). Only web-platform APIs
 * (fetch, AbortController, crypto, TextDecoder) are used, so this runs in browsers as is.
 */

import { ConnectionFailedError, CorsRefusedError, errorFromReply } from './errors.js'
import { fetchTrusting, unverified, type CertificateAuthorities } from './trust.js'

export const DEFAULT_BASE_URL = 'http://127.0.0.1:8080'
/** Milliseconds a call keeps retrying a broker out of reach or answering 503: longer than a
 * Redis Sentinel or Cluster failover takes (typically 4-9 s; docs/scaling.md). */
export const DEFAULT_RETRY_FOR = 20_000

/** How to reach the broker and how patiently to talk to it. */
export interface MempOptions {
  /** API key, JWT or admin key; default: `MEMP_API_KEY` from the environment (Node.js). */
  apiKey?: string | undefined
  /** Namespace for every call unless one is given per call; default: `MEMP_NAMESPACE`. */
  namespace?: string | undefined
  /** Default: `MEMP_BASE_URL`, else `http://127.0.0.1:8080`. */
  baseUrl?: string | undefined
  /** Milliseconds one request attempt may take (default 10 000). */
  timeout?: number | undefined
  /**
   * Milliseconds a call keeps resending, with backoff, after a connection error or a 503 (or a
   * short 429), e.g. through a Redis failover; 0: no retries. Default: `MEMP_RETRY_FOR`
   * (seconds) from the environment, else 20 000.
   */
  retryFor?: number | undefined
  /** At most this many resends as well (default: as many as fit in `retryFor`). */
  maxRetries?: number | undefined
  /**
   * Told what a call waits for when it first retries ("the broker at ... is unavailable
   * (503); retrying PUT ... for up to 20 s more"). Default: `console.warn`; `null` says nothing.
   */
  onRetry?: ((message: string) => void) | null | undefined
  /** Milliseconds a subscription waits for any byte before it reconnects (default 60 000). */
  streamTimeout?: number | undefined
  /**
   * PEM certificates of the CAs to verify an `https://` broker against, instead of the default
   * trust (Node.js only). Default: the PEM file named by `MEMP_CA_BUNDLE`, if set.
   */
  ca?: CertificateAuthorities | undefined
  /** A `fetch` to use instead of the global one (a proxy agent, instrumentation...). */
  fetch?: typeof fetch | undefined
}

export interface Config {
  baseUrl: string
  apiKey: string | null
  namespace: string | null
  timeout: number
  retryFor: number
  maxRetries: number
  onRetry: ((message: string) => void) | null
  streamTimeout: number
  backoff: number
  maxBackoff: number
  fetch: typeof fetch
  /** Where the CAs trusted come from, when not from the platform (for error messages). */
  trust: string | null
}

/** Options every call takes. */
export interface CallOptions {
  /** Work in this namespace instead of the client's. */
  namespace?: string | undefined
  /** Abandon the call (and its retries); it rejects with the signal's reason. */
  signal?: AbortSignal | undefined
}

/** Environment variables where there is an environment (Node.js); nothing in a browser. */
function env(name: string): string | undefined {
  const process = (globalThis as { process?: { env?: Record<string, string | undefined> } })
    .process
  const value = process?.env?.[name]
  return value === '' ? undefined : value
}

/** MEMP_RETRY_FOR (seconds) in milliseconds, else the default. */
function retryForFromEnv(): number {
  const text = env('MEMP_RETRY_FOR')
  if (text === undefined) return DEFAULT_RETRY_FOR
  const seconds = /^\d+(\.\d+)?$/.test(text.trim()) ? Number(text) : NaN
  if (!Number.isFinite(seconds)) {
    throw new TypeError(`MEMP_RETRY_FOR must be a number of seconds, not ${JSON.stringify(text)}`)
  }
  return seconds * 1000
}

/** Options win over MEMP_API_KEY, MEMP_NAMESPACE, MEMP_BASE_URL, MEMP_CA_BUNDLE and
 * MEMP_RETRY_FOR. */
export function resolveConfig(options: MempOptions): Config {
  const baseUrl = options.baseUrl || env('MEMP_BASE_URL') || DEFAULT_BASE_URL
  if (options.fetch && options.ca !== undefined) {
    throw new TypeError('pass either `fetch` or `ca`: `ca` sets up the fetch the SDK makes')
  }
  const bundle = options.fetch || options.ca !== undefined ? undefined : env('MEMP_CA_BUNDLE')
  let fetcher: typeof fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init))
  let trust: string | null = null
  if (options.ca !== undefined) {
    fetcher = fetchTrusting(options.ca)
    trust = 'the `ca` option'
  } else if (bundle) {
    fetcher = fetchTrusting(undefined, bundle)
    trust = `the CA bundle ${bundle}`
  }
  const apiKey = options.apiKey || env('MEMP_API_KEY') || null
  if (!apiKey) {
    // Every call needs a token: say so now rather than with a 401 (or a stream retried) later.
    throw new TypeError(
      'no API key: pass { apiKey } or set MEMP_API_KEY (a key from registering an agent or ' +
        'from POST /v1/keys, or the admin key)',
    )
  }
  if (!/^https?:\/\/[^/]/i.test(baseUrl)) {
    throw new TypeError(`the broker URL must start with http:// or https:// (got ${JSON.stringify(baseUrl)})`)
  }
  return {
    baseUrl: baseUrl.replace(/\/+$/, ''),
    apiKey,
    namespace: options.namespace || env('MEMP_NAMESPACE') || null,
    timeout: options.timeout ?? 10_000,
    retryFor: options.retryFor ?? retryForFromEnv(),
    maxRetries: options.maxRetries ?? Infinity,
    onRetry: options.onRetry === undefined ? (message) => console.warn(message) : options.onRetry,
    streamTimeout: options.streamTimeout ?? 60_000,
    backoff: 200,
    maxBackoff: 5_000,
    fetch: fetcher,
    trust,
  }
}

/** One request. `idempotent` ones may be resent when the first try may have reached the broker
 * (reads, and writes carrying an Idempotency-Key); others only when it surely did not. */
export interface Call {
  method: 'GET' | 'PUT' | 'POST' | 'PATCH' | 'DELETE'
  path: string
  query?: Record<string, string | number | undefined>
  headers?: Record<string, string>
  body?: unknown
  idempotent: boolean
  signal?: AbortSignal | undefined
}

/** A successful reply: its JSON body and headers. */
export interface Reply {
  status: number
  headers: Headers
  body: any
}

/** A v4 UUID: `crypto.randomUUID` where the platform has it (it needs a secure context in
 * browsers), else one made from `crypto.getRandomValues`. */
export function messageId(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID()
  const bytes = crypto.getRandomValues(new Uint8Array(16))
  bytes[6] = (bytes[6]! & 0x0f) | 0x40
  bytes[8] = (bytes[8]! & 0x3f) | 0x80
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')
  const parts = [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20), hex.slice(20)]
  return parts.join('-')
}

export class Transport {
  constructor(readonly config: Config) {}

  url(path: string, query?: Record<string, string | number | undefined> | URLSearchParams): string {
    let search = ''
    if (query instanceof URLSearchParams) {
      search = query.toString()
    } else if (query) {
      const params = new URLSearchParams()
      for (const [name, value] of Object.entries(query)) {
        if (value !== undefined) params.append(name, String(value))
      }
      search = params.toString()
    }
    return this.config.baseUrl + path + (search ? `?${search}` : '')
  }

  headers(extra: Record<string, string> = {}): Record<string, string> {
    const headers: Record<string, string> = { Accept: 'application/json', ...extra }
    if (this.config.apiKey) headers['Authorization'] = `Bearer ${this.config.apiKey}`
    return headers
  }

  /** Milliseconds to wait before attempt `attempt + 1`: exponential backoff with full jitter;
   * a server's Retry-After is a floor. */
  delay(attempt: number, retryAfter?: string | null): number {
    const cap = Math.min(this.config.maxBackoff, this.config.backoff * 2 ** attempt)
    let delay = Math.random() * cap
    if (retryAfter && /^\d+$/.test(retryAfter)) {
      delay = Math.max(delay, Math.min(Number(retryAfter) * 1000, this.config.maxBackoff))
    }
    return delay
  }

  async send(call: Call): Promise<Reply> {
    const headers = this.headers(call.headers)
    let body: string | null = null
    if (call.body !== undefined) {
      body = JSON.stringify(call.body)
      headers['Content-Type'] = 'application/json'
    }
    const url = this.url(call.path, call.query)
    const started = Date.now()
    /** The wait before the next try, or null to give up: tries go on with backoff until
     * `retryFor` has passed since the first (and at most `maxRetries` resends); the first wait
     * is told to `onRetry`, saying what it waits for. */
    const pause = (attempt: number, what: string, retryAfter?: string | null): number | null => {
      const left = this.config.retryFor - (Date.now() - started)
      if (left <= 0 || attempt >= this.config.maxRetries) return null
      if (attempt === 0) {
        const seconds = left >= 1000 ? (left / 1000).toFixed(0) : (left / 1000).toFixed(1)
        this.config.onRetry?.(
          `memp: ${what}; retrying ${call.method} ${call.path} for up to ${seconds} s more`,
        )
      }
      return Math.min(this.delay(attempt, retryAfter), left)
    }
    for (let attempt = 0; ; attempt++) {
      call.signal?.throwIfAborted()
      let response: Response
      let text: string
      const timeout = new AbortController()
      const timer = setTimeout(
        () => timeout.abort(new DOMException('request timed out', 'TimeoutError')),
        this.config.timeout,
      )
      const unlink = link(call.signal, timeout)
      try {
        response = await this.config.fetch(url, {
          method: call.method,
          headers,
          body,
          signal: timeout.signal,
        })
        text = await response.text()
      } catch (error) {
        call.signal?.throwIfAborted()
        if (error instanceof ConnectionFailedError) throw error // an unreadable CA bundle
        const refused = certificateError(error, this.config) ?? (await corsRefusal(error, this.config))
        if (refused) throw refused // the same certificate (or origin) would be refused again
        const resendable = call.idempotent || notSent(error)
        const wait = resendable
          ? pause(attempt, `could not reach the broker at ${this.config.baseUrl} (${describe(error)})`)
          : null
        if (wait === null) {
          throw new ConnectionFailedError(
            `could not reach the broker at ${this.config.baseUrl}: ${describe(error)}`,
            { code: 'connection_error', cause: error },
          )
        }
        await sleep(wait, call.signal)
        continue
      } finally {
        clearTimeout(timer)
        unlink()
      }
      const json = parseJson(text)
      if (response.ok) return { status: response.status, headers: response.headers, body: json }
      // A 503 may have been applied (the store froze after running the write): only calls
      // that are safe to repeat are resent after one.
      if (response.status === 503 && call.idempotent) {
        const wait = pause(attempt, `the broker at ${this.config.baseUrl} is unavailable (503)`,
          response.headers.get('retry-after'))
        if (wait !== null) {
          await sleep(wait, call.signal)
          continue
        }
      }
      // A 429 wrote nothing: any call is resent once the wait it asks for has passed, when
      // that is within the backoff cap (a quota's 429 asks for none: waiting lifts no quota).
      const asked = response.headers.get('retry-after')
      if (
        response.status === 429 &&
        asked !== null &&
        /^\d+$/.test(asked) &&
        Number(asked) * 1000 <= this.config.maxBackoff
      ) {
        const wait = pause(attempt, `the broker at ${this.config.baseUrl} is rate limited`, asked)
        if (wait !== null) {
          await sleep(wait, call.signal)
          continue
        }
      }
      throw errorFromReply(response.status, response.statusText, json, response.headers)
    }
  }
}

/**
 * In a browser, a fetch the broker's CORS policy refuses fails exactly as an unreachable broker
 * does. A `no-cors` request (whose reply the page may not read) tells them apart: it succeeds
 * when the broker answers. Returns the error for a refused origin, or null.
 */
export async function corsRefusal(error: unknown, config: Config): Promise<CorsRefusedError | null> {
  const origin = (globalThis as { location?: { origin?: string } }).location?.origin
  if (!(error instanceof TypeError) || !origin || origin === 'null') return null
  let target: URL
  try {
    target = new URL(config.baseUrl)
  } catch {
    return null
  }
  if (target.origin === origin) return null
  try {
    await config.fetch(`${config.baseUrl}/healthz`, { mode: 'no-cors', cache: 'no-store' })
  } catch {
    return null // the broker is out of reach: a network failure after all
  }
  return new CorsRefusedError(
    `the broker at ${config.baseUrl} does not allow this page's origin ${origin}: add it to ` +
      'the broker\'s MEMP_CORS_ORIGINS',
    { code: 'cors_refused', cause: error },
  )
}

/** The JSON in a reply body, or null when it has none. */
export function parseJson(text: string): unknown {
  if (text === '') return null
  try {
    return JSON.parse(text)
  } catch {
    return null
  }
}

/** True when a fetch error shows the request never left (connection refused); Node.js says
 * so in the error's cause, browsers never do. */
function notSent(error: unknown): boolean {
  const cause = (error as { cause?: { code?: unknown } } | null)?.cause
  return cause?.code === 'ECONNREFUSED'
}

/** The error for a certificate that could not be verified, or null for other failures. */
export function certificateError(error: unknown, config: Config): ConnectionFailedError | null {
  const refused = unverified(error)
  if (!refused) return null
  const trust = config.trust
    ? `${config.trust} does not vouch for it`
    : 'pass the `ca` option or set MEMP_CA_BUNDLE to the CA that signed it'
  return new ConnectionFailedError(
    `could not verify the certificate of the broker at ${config.baseUrl}: ${refused.message}; ${trust}`,
    { code: 'connection_error', cause: error },
  )
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error)
  const cause = (error as { cause?: unknown }).cause
  const reason = cause instanceof Error ? `${error.message} (${cause.message})` : error.message
  return reason || error.name
}

/** Abort `target` when `source` aborts; returns the unlink function. */
export function link(source: AbortSignal | undefined, target: AbortController): () => void {
  if (!source) return () => {}
  if (source.aborted) {
    target.abort(source.reason)
    return () => {}
  }
  const abort = (): void => target.abort(source.reason)
  source.addEventListener('abort', abort, { once: true })
  return () => source.removeEventListener('abort', abort)
}

/** Wait `ms`, or until `signal` aborts (then reject with its reason). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason)
      return
    }
    const done = (): void => {
      signal?.removeEventListener('abort', abort)
      resolve()
    }
    const timer = setTimeout(done, ms)
    const abort = (): void => {
      clearTimeout(timer)
      reject(signal!.reason)
    }
    signal?.addEventListener('abort', abort, { once: true })
  })
}
