/** One error class per broker error code, all under `MempError`, keeping the broker's message. */

import { toEntry, type Entry, type SchemaError, type WireEntry } from './models.js'

/**
 * An error from the broker (`code`, `status`, `message`, `details` as it sent them), or from
 * reaching it (`code` `connection_error`, `status` null).
 */
export class MempError extends Error {
  readonly code: string
  readonly status: number | null
  readonly details: Record<string, unknown>
  /** The broker's id for the request (its `X-Request-ID`), to quote when reporting a problem. */
  readonly requestId: string | null

  constructor(
    message: string,
    options: {
      code?: string
      status?: number | null
      details?: Record<string, unknown>
      cause?: unknown
      requestId?: string | null
    } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause })
    this.name = new.target.name
    this.code = options.code ?? 'internal'
    this.status = options.status ?? null
    this.details = options.details ?? {}
    this.requestId = options.requestId ?? null
  }

  /** The request field the broker names as wrong (`details.field`, e.g. on `/amp`). */
  get field(): string | null {
    const field = this.details['field']
    return typeof field === 'string' ? field : null
  }
}

/** 202: the write needs a reviewer's approval and was not applied; `proposal` is the pending
 * proposal (`client.proposals.get(proposal.id)` follows it). */
export class ApprovalPendingError extends MempError {
  readonly proposal: any

  constructor(proposal: { id: string; key: string }) {
    super(`${proposal.key} awaits approval as proposal ${proposal.id}`, {
      code: 'approval_pending',
      status: 202,
      details: { id: proposal.id },
    })
    this.proposal = proposal
  }
}

/** 400 (or 414, 415, 431): the request is malformed (`code` says which check: invalid_key,
 * invalid_ttl, ..., headers_too_large). */
export class InvalidRequestError extends MempError {}

/** 401: missing, unknown, revoked, expired or forged token. */
export class UnauthorizedError extends MempError {}

/** 403: the token lacks the permission on that namespace. */
export class ForbiddenError extends MempError {}

/** 404: no such entry, agent, key or endpoint. */
export class NotFoundError extends MempError {}

/** 409 write_conflict: a newer (or higher-priority) write is stored; `winner` is that entry. */
export class ConflictError extends MempError {
  get winner(): Entry | null {
    return entryDetail(this.details['winner'])
  }

  /** The AMP cell's status when that forbids the change (archived cells are read-only, and
   * only they may be deleted). */
  get cellStatus(): string | null {
    const status = this.details['status']
    return typeof status === 'string' ? status : null
  }
}

/** 412: `ifVersion` / `ifAbsent` did not hold; `currentVersion` is the stored version. */
export class PreconditionFailedError extends MempError {
  get currentVersion(): number | null {
    const version = this.details['current_version']
    return typeof version === 'number' ? version : null
  }

  get current(): Entry | null {
    return entryDetail(this.details['current'])
  }
}

/** 413: value, body or batch over the broker's limit. */
export class PayloadTooLargeError extends MempError {}

/** 422: the value does not conform to an enforcing JSON Schema; nothing was written. */
export class SchemaViolationError extends MempError {
  get errors(): SchemaError[] {
    const errors = this.details['errors']
    if (!Array.isArray(errors)) return []
    return errors.map((e: { schema_id?: string; path?: string; message?: string }) => ({
      schemaId: e.schema_id ?? '',
      path: e.path ?? '',
      message: e.message ?? '',
    }))
  }
}

/** 429 rate_limited: the agent's or the namespace's rate is spent (`scope`); nothing was
 * written. `retryAfter` is how many seconds to wait. The SDK retries by itself when the wait is
 * within its backoff cap (`maxBackoff`), and throws this otherwise. */
export class RateLimitedError extends MempError {
  get retryAfter(): number | null {
    const ms = this.details['retry_after_ms']
    if (typeof ms === 'number') return ms / 1000
    const seconds = this.details['retry_after']
    return typeof seconds === 'number' ? seconds : null
  }

  get scope(): string | null {
    const scope = this.details['scope']
    return typeof scope === 'string' ? scope : null
  }
}

/** 429 quota_exceeded: the write (or stream, or proposal) would take the namespace past
 * `limit` (`max_keys`, `max_bytes`, `max_streams`, `max_streams_per_token`,
 * `max_pending_proposals`); `used` of `maximum` are in use. Nothing was written; waiting does
 * not help, deleting (or deciding proposals) does. Never retried. */
export class QuotaExceededError extends MempError {
  get limit(): string | null {
    const limit = this.details['limit']
    return typeof limit === 'string' ? limit : null
  }

  get used(): number | null {
    const used = this.details['used']
    return typeof used === 'number' ? used : null
  }

  get maximum(): number | null {
    const maximum = this.details['max']
    return typeof maximum === 'number' ? maximum : null
  }
}

/** 503: the broker cannot reach its store; safe to retry later. */
export class UnavailableError extends MempError {}

/** The broker could not be reached, or the connection broke, after every retry. */
export class ConnectionFailedError extends MempError {}

/** A browser page's origin is not in the broker's MEMP_CORS_ORIGINS: the broker answers, but
 * the browser hides its replies from this page. Retrying cannot help. */
export class CorsRefusedError extends ConnectionFailedError {}

/** `Subscription.open({ timeout })` passed without the stream opening; `cause` is the last
 * error. */
export class OpenTimeoutError extends ConnectionFailedError {}

type MempErrorOptions = ConstructorParameters<typeof MempError>[1]
type ErrorClass = new (message: string, options: MempErrorOptions) => MempError

/** The broker's error codes (`ErrorCode` in its `openapi.yaml`). */
export const ERROR_CODES = [
  'invalid_request',
  'invalid_json',
  'invalid_key',
  'invalid_namespace',
  'invalid_pattern',
  'invalid_ttl',
  'invalid_schema',
  'invalid_timestamp',
  'unauthorized',
  'forbidden',
  'not_found',
  'method_not_allowed',
  'request_timeout',
  'write_conflict',
  'precondition_failed',
  'payload_too_large',
  'uri_too_long',
  'unsupported_media_type',
  'schema_violation',
  'schema_timeout',
  'idempotency_key_reused',
  'rate_limited',
  'quota_exceeded',
  'headers_too_large',
  'internal',
  'corrupt_record',
  'unavailable',
] as const

export type ErrorCode = (typeof ERROR_CODES)[number]

/** The class for each code; a code from a newer broker falls back to its status's class. */
const BY_CODE: Record<ErrorCode, ErrorClass> = {
  invalid_request: InvalidRequestError,
  invalid_json: InvalidRequestError,
  invalid_key: InvalidRequestError,
  invalid_namespace: InvalidRequestError,
  invalid_pattern: InvalidRequestError,
  invalid_ttl: InvalidRequestError,
  invalid_timestamp: InvalidRequestError,
  invalid_schema: InvalidRequestError,
  unsupported_media_type: InvalidRequestError,
  uri_too_long: InvalidRequestError,
  headers_too_large: InvalidRequestError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  not_found: NotFoundError,
  write_conflict: ConflictError,
  precondition_failed: PreconditionFailedError,
  payload_too_large: PayloadTooLargeError,
  schema_violation: SchemaViolationError,
  rate_limited: RateLimitedError,
  quota_exceeded: QuotaExceededError,
  unavailable: UnavailableError,
  method_not_allowed: MempError,
  request_timeout: MempError,
  schema_timeout: MempError,
  idempotency_key_reused: MempError,
  internal: MempError,
  corrupt_record: MempError,
}

const BY_STATUS: Record<number, [ErrorClass, string]> = {
  400: [InvalidRequestError, 'invalid_request'],
  401: [UnauthorizedError, 'unauthorized'],
  403: [ForbiddenError, 'forbidden'],
  404: [NotFoundError, 'not_found'],
  409: [ConflictError, 'write_conflict'],
  412: [PreconditionFailedError, 'precondition_failed'],
  413: [PayloadTooLargeError, 'payload_too_large'],
  415: [InvalidRequestError, 'unsupported_media_type'],
  422: [SchemaViolationError, 'schema_violation'],
  429: [RateLimitedError, 'rate_limited'],
  503: [UnavailableError, 'unavailable'],
}

/** The error for a broker's error reply, from its `{"error": {...}}` body when it has one. */
export function errorFromReply(
  status: number,
  statusText: string,
  body: unknown,
  headers?: Headers,
): MempError {
  let [kind, code] = BY_STATUS[status] ?? [MempError, status >= 500 ? 'internal' : 'http_error']
  let message = statusText || `HTTP ${status}`
  let details: Record<string, unknown> = {}
  let requestId = headers?.get('x-request-id') ?? null
  const error = isObject(body) ? body['error'] : undefined
  if (isObject(error)) {
    if (typeof error['code'] === 'string') code = error['code']
    if (typeof error['message'] === 'string') message = error['message']
    if (isObject(error['details'])) details = error['details']
    if (typeof error['request_id'] === 'string') requestId = error['request_id']
    if (Object.hasOwn(BY_CODE, code)) kind = BY_CODE[code as ErrorCode]
  }
  return new kind(message, { code, status, details, requestId })
}

function entryDetail(raw: unknown): Entry | null {
  if (!isObject(raw) || typeof raw['key'] !== 'string' || typeof raw['version'] !== 'number') {
    return null
  }
  return toEntry(raw as unknown as WireEntry)
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}
