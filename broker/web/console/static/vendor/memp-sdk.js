// memp-sdk browser bundle: generated from sdk-js/src by `npm run bundle:console`; do not edit.

// src/models.ts
var WARNINGS = ["schema_violation", "conflicts"];
var PERMISSIONS = [
  "read",
  "write",
  "subscribe",
  "admin",
  "impersonate",
  "amp",
  "review",
  "audit"
];
var EVENT_TYPES = [
  "put",
  "delete",
  "expire",
  "snapshot",
  "snapshot-end",
  "reset",
  "proposal",
  "approved",
  "rejected",
  "expired"
];
var END_EVENT_TYPES = ["overflow", "shutdown", "revoked"];
var CURSOR_EVENT_TYPES = ["progress"];
function toEntry(wire, headerWarnings = []) {
  const schemaErrors = wire.schema_errors ? wire.schema_errors.map((e) => ({ schemaId: e.schema_id, path: e.path, message: e.message })) : null;
  const conflicts = wire.conflicts ? wire.conflicts.map((c) => ({
    path: c.path,
    base: c.base ?? null,
    stored: c.stored ?? null,
    incoming: c.incoming ?? null,
    storedAgent: c.stored_agent ?? null,
    incomingAgent: c.incoming_agent ?? null,
    baseMissing: c.base_missing ?? false
  })) : null;
  const schemaViolation = wire.schema_violation ?? false;
  const warnings = new Set(headerWarnings);
  if (schemaViolation) warnings.add("schema_violation");
  if (conflicts) warnings.add("conflicts");
  return {
    id: wire.id,
    agentId: wire.agent_id,
    namespace: wire.namespace,
    key: wire.key,
    value: wire.value ?? null,
    ttlSeconds: wire.ttl_seconds ?? null,
    version: wire.version,
    createdAt: wire.created_at,
    updatedAt: wire.updated_at,
    timestamp: wire.timestamp ?? null,
    expiresAt: wire.expires_at ?? null,
    schemaViolation,
    deleted: wire.deleted ?? false,
    schemaErrors,
    conflicts,
    approvedBy: wire.approved_by ?? null,
    proposalId: wire.proposal_id ?? null,
    warnings: [...warnings]
  };
}
function toAgent(wire) {
  return {
    id: wire.id,
    name: wire.name,
    framework: wire.framework,
    namespace: wire.namespace,
    createdAt: wire.created_at,
    lastSeen: wire.last_seen
  };
}
function toApiKey(wire) {
  return {
    id: wire.id,
    name: wire.name,
    grants: wire.grants,
    agentId: wire.agent_id ?? null,
    createdAt: wire.created_at,
    createdBy: wire.created_by
  };
}
function toCredentials(wire) {
  return { apiKey: wire.api_key, keyId: wire.key_id, agentId: wire.agent_id ?? null };
}
function parseWarnings(header) {
  if (!header) return [];
  return header.split(",").map((word) => word.trim()).filter((word) => word !== "");
}

// src/errors.ts
var MempError = class extends Error {
  code;
  status;
  details;
  /** The broker's id for the request (its `X-Request-ID`), to quote when reporting a problem. */
  requestId;
  constructor(message, options = {}) {
    super(message, options.cause === void 0 ? void 0 : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? "internal";
    this.status = options.status ?? null;
    this.details = options.details ?? {};
    this.requestId = options.requestId ?? null;
  }
  /** The request field the broker names as wrong (`details.field`, e.g. on `/amp`). */
  get field() {
    const field = this.details["field"];
    return typeof field === "string" ? field : null;
  }
};
var ApprovalPendingError = class extends MempError {
  proposal;
  constructor(proposal) {
    super(`${proposal.key} awaits approval as proposal ${proposal.id}`, {
      code: "approval_pending",
      status: 202,
      details: { id: proposal.id }
    });
    this.proposal = proposal;
  }
};
var InvalidRequestError = class extends MempError {
};
var UnauthorizedError = class extends MempError {
};
var ForbiddenError = class extends MempError {
};
var NotFoundError = class extends MempError {
};
var ConflictError = class extends MempError {
  get winner() {
    return entryDetail(this.details["winner"]);
  }
  /** The AMP cell's status when that forbids the change (archived cells are read-only, and
   * only they may be deleted). */
  get cellStatus() {
    const status = this.details["status"];
    return typeof status === "string" ? status : null;
  }
};
var PreconditionFailedError = class extends MempError {
  get currentVersion() {
    const version = this.details["current_version"];
    return typeof version === "number" ? version : null;
  }
  get current() {
    return entryDetail(this.details["current"]);
  }
};
var PayloadTooLargeError = class extends MempError {
};
var SchemaViolationError = class extends MempError {
  get errors() {
    const errors = this.details["errors"];
    if (!Array.isArray(errors)) return [];
    return errors.map((e) => ({
      schemaId: e.schema_id ?? "",
      path: e.path ?? "",
      message: e.message ?? ""
    }));
  }
};
var RateLimitedError = class extends MempError {
  get retryAfter() {
    const ms = this.details["retry_after_ms"];
    if (typeof ms === "number") return ms / 1e3;
    const seconds = this.details["retry_after"];
    return typeof seconds === "number" ? seconds : null;
  }
  get scope() {
    const scope = this.details["scope"];
    return typeof scope === "string" ? scope : null;
  }
};
var QuotaExceededError = class extends MempError {
  get limit() {
    const limit = this.details["limit"];
    return typeof limit === "string" ? limit : null;
  }
  get used() {
    const used = this.details["used"];
    return typeof used === "number" ? used : null;
  }
  get maximum() {
    const maximum = this.details["max"];
    return typeof maximum === "number" ? maximum : null;
  }
};
var UnavailableError = class extends MempError {
};
var ConnectionFailedError = class extends MempError {
};
var CorsRefusedError = class extends ConnectionFailedError {
};
var OpenTimeoutError = class extends ConnectionFailedError {
};
var ERROR_CODES = [
  "invalid_request",
  "invalid_json",
  "invalid_key",
  "invalid_namespace",
  "invalid_pattern",
  "invalid_ttl",
  "invalid_schema",
  "invalid_timestamp",
  "unauthorized",
  "forbidden",
  "not_found",
  "method_not_allowed",
  "request_timeout",
  "write_conflict",
  "precondition_failed",
  "payload_too_large",
  "uri_too_long",
  "unsupported_media_type",
  "schema_violation",
  "schema_timeout",
  "idempotency_key_reused",
  "rate_limited",
  "quota_exceeded",
  "headers_too_large",
  "internal",
  "corrupt_record",
  "unavailable"
];
var BY_CODE = {
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
  corrupt_record: MempError
};
var BY_STATUS = {
  400: [InvalidRequestError, "invalid_request"],
  401: [UnauthorizedError, "unauthorized"],
  403: [ForbiddenError, "forbidden"],
  404: [NotFoundError, "not_found"],
  409: [ConflictError, "write_conflict"],
  412: [PreconditionFailedError, "precondition_failed"],
  413: [PayloadTooLargeError, "payload_too_large"],
  415: [InvalidRequestError, "unsupported_media_type"],
  422: [SchemaViolationError, "schema_violation"],
  429: [RateLimitedError, "rate_limited"],
  503: [UnavailableError, "unavailable"]
};
function errorFromReply(status, statusText, body, headers) {
  let [kind, code] = BY_STATUS[status] ?? [MempError, status >= 500 ? "internal" : "http_error"];
  let message = statusText || `HTTP ${status}`;
  let details = {};
  let requestId = headers?.get("x-request-id") ?? null;
  const error = isObject(body) ? body["error"] : void 0;
  if (isObject(error)) {
    if (typeof error["code"] === "string") code = error["code"];
    if (typeof error["message"] === "string") message = error["message"];
    if (isObject(error["details"])) details = error["details"];
    if (typeof error["request_id"] === "string") requestId = error["request_id"];
    if (Object.hasOwn(BY_CODE, code)) kind = BY_CODE[code];
  }
  return new kind(message, { code, status, details, requestId });
}
function entryDetail(raw) {
  if (!isObject(raw) || typeof raw["key"] !== "string" || typeof raw["version"] !== "number") {
    return null;
  }
  return toEntry(raw);
}
function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

// src/resources.ts
function namespacePath(namespace, ...rest) {
  if (namespace === "." || namespace === ".." || namespace.includes("/")) {
    throw new InvalidRequestError(`namespace ${JSON.stringify(namespace)} is not a namespace`, {
      code: "invalid_namespace",
      status: 400,
      details: { namespace }
    });
  }
  return ["/v1/namespaces", namespace, ...rest].map((p, i) => i ? encodeURIComponent(p) : p).join("/");
}
function pageQuery(options) {
  return { cursor: options.cursor ?? void 0, limit: options.limit };
}
async function getResource(transport, scope, options, rest, query) {
  const reply = await transport.send({
    method: "GET",
    path: namespacePath(scope.requireNamespace(options.namespace), ...rest),
    ...query ? { query } : {},
    idempotent: true,
    signal: options.signal
  });
  return reply.body;
}

// src/trust.ts
function fetchTrusting(ca, file) {
  let ready;
  return async (input, init) => {
    ready ??= build(ca, file);
    return (await ready)(input, init);
  };
}
async function build(ca, file) {
  const pems = file === void 0 ? texts(ca ?? []) : [await read(file)];
  const undici = await load("undici");
  const dispatcher = new undici.Agent({ connect: { ca: pems } });
  return (input, init) => undici.fetch(input, { ...init, dispatcher });
}
async function read(file) {
  const fs = await load("node:fs/promises");
  try {
    return await fs.readFile(file, "utf8");
  } catch (error) {
    throw new ConnectionFailedError(
      `cannot read the CA bundle ${file} (MEMP_CA_BUNDLE): ${error.message}`,
      { code: "connection_error", cause: error }
    );
  }
}
function load(name) {
  return import(name);
}
function texts(ca) {
  const list = typeof ca === "string" || ca instanceof Uint8Array ? [ca] : [...ca];
  return list.map((pem) => typeof pem === "string" ? pem : new TextDecoder().decode(pem));
}
var UNVERIFIED = /* @__PURE__ */ new Set([
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_REJECTED",
  "CERT_REVOKED",
  "CERT_SIGNATURE_FAILURE",
  "CERT_UNTRUSTED",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "HOSTNAME_MISMATCH",
  "INVALID_CA",
  "INVALID_PURPOSE",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE"
]);
function unverified(error) {
  let cause = error;
  for (let depth = 0; depth < 4 && cause instanceof Error; depth++) {
    const code = cause.code;
    if (typeof code === "string" && UNVERIFIED.has(code)) return cause;
    cause = cause.cause;
  }
  return null;
}

// src/transport.ts
var DEFAULT_BASE_URL = "http://127.0.0.1:8080";
var DEFAULT_RETRY_FOR = 2e4;
function env(name) {
  const process = globalThis.process;
  const value = process?.env?.[name];
  return value === "" ? void 0 : value;
}
function retryForFromEnv() {
  const text = env("MEMP_RETRY_FOR");
  if (text === void 0) return DEFAULT_RETRY_FOR;
  const seconds = /^\d+(\.\d+)?$/.test(text.trim()) ? Number(text) : NaN;
  if (!Number.isFinite(seconds)) {
    throw new TypeError(`MEMP_RETRY_FOR must be a number of seconds, not ${JSON.stringify(text)}`);
  }
  return seconds * 1e3;
}
function resolveConfig(options) {
  const baseUrl = options.baseUrl || env("MEMP_BASE_URL") || DEFAULT_BASE_URL;
  if (options.fetch && options.ca !== void 0) {
    throw new TypeError("pass either `fetch` or `ca`: `ca` sets up the fetch the SDK makes");
  }
  const bundle = options.fetch || options.ca !== void 0 ? void 0 : env("MEMP_CA_BUNDLE");
  let fetcher = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  let trust = null;
  if (options.ca !== void 0) {
    fetcher = fetchTrusting(options.ca);
    trust = "the `ca` option";
  } else if (bundle) {
    fetcher = fetchTrusting(void 0, bundle);
    trust = `the CA bundle ${bundle}`;
  }
  const apiKey = options.apiKey || env("MEMP_API_KEY") || null;
  if (!apiKey) {
    throw new TypeError(
      "no API key: pass { apiKey } or set MEMP_API_KEY (a key from registering an agent or from POST /v1/keys, or the admin key)"
    );
  }
  if (!/^https?:\/\/[^/]/i.test(baseUrl)) {
    throw new TypeError(`the broker URL must start with http:// or https:// (got ${JSON.stringify(baseUrl)})`);
  }
  return {
    baseUrl: baseUrl.replace(/\/+$/, ""),
    apiKey,
    namespace: options.namespace || env("MEMP_NAMESPACE") || null,
    timeout: options.timeout ?? 1e4,
    retryFor: options.retryFor ?? retryForFromEnv(),
    maxRetries: options.maxRetries ?? Infinity,
    onRetry: options.onRetry === void 0 ? (message) => console.warn(message) : options.onRetry,
    streamTimeout: options.streamTimeout ?? 6e4,
    backoff: 200,
    maxBackoff: 5e3,
    fetch: fetcher,
    trust
  };
}
function messageId() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = bytes[6] & 15 | 64;
  bytes[8] = bytes[8] & 63 | 128;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  const parts = [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20), hex.slice(20)];
  return parts.join("-");
}
var Transport = class {
  constructor(config) {
    this.config = config;
  }
  config;
  url(path, query) {
    let search = "";
    if (query instanceof URLSearchParams) {
      search = query.toString();
    } else if (query) {
      const params = new URLSearchParams();
      for (const [name, value] of Object.entries(query)) {
        if (value !== void 0) params.append(name, String(value));
      }
      search = params.toString();
    }
    return this.config.baseUrl + path + (search ? `?${search}` : "");
  }
  headers(extra = {}) {
    const headers = { Accept: "application/json", ...extra };
    if (this.config.apiKey) headers["Authorization"] = `Bearer ${this.config.apiKey}`;
    return headers;
  }
  /** Milliseconds to wait before attempt `attempt + 1`: exponential backoff with full jitter;
   * a server's Retry-After is a floor. */
  delay(attempt, retryAfter) {
    const cap = Math.min(this.config.maxBackoff, this.config.backoff * 2 ** attempt);
    let delay = Math.random() * cap;
    if (retryAfter && /^\d+$/.test(retryAfter)) {
      delay = Math.max(delay, Math.min(Number(retryAfter) * 1e3, this.config.maxBackoff));
    }
    return delay;
  }
  async send(call) {
    const headers = this.headers(call.headers);
    let body = null;
    if (call.body !== void 0) {
      body = JSON.stringify(call.body);
      headers["Content-Type"] = "application/json";
    }
    const url = this.url(call.path, call.query);
    const started = Date.now();
    const pause = (attempt, what, retryAfter) => {
      const left = this.config.retryFor - (Date.now() - started);
      if (left <= 0 || attempt >= this.config.maxRetries) return null;
      if (attempt === 0) {
        const seconds = left >= 1e3 ? (left / 1e3).toFixed(0) : (left / 1e3).toFixed(1);
        this.config.onRetry?.(
          `memp: ${what}; retrying ${call.method} ${call.path} for up to ${seconds} s more`
        );
      }
      return Math.min(this.delay(attempt, retryAfter), left);
    };
    for (let attempt = 0; ; attempt++) {
      call.signal?.throwIfAborted();
      let response;
      let text;
      const timeout = new AbortController();
      const timer = setTimeout(
        () => timeout.abort(new DOMException("request timed out", "TimeoutError")),
        this.config.timeout
      );
      const unlink = link(call.signal, timeout);
      try {
        response = await this.config.fetch(url, {
          method: call.method,
          headers,
          body,
          signal: timeout.signal
        });
        text = await response.text();
      } catch (error) {
        call.signal?.throwIfAborted();
        if (error instanceof ConnectionFailedError) throw error;
        const refused = certificateError(error, this.config) ?? await corsRefusal(error, this.config);
        if (refused) throw refused;
        const resendable = call.idempotent || notSent(error);
        const wait = resendable ? pause(attempt, `could not reach the broker at ${this.config.baseUrl} (${describe(error)})`) : null;
        if (wait === null) {
          throw new ConnectionFailedError(
            `could not reach the broker at ${this.config.baseUrl}: ${describe(error)}`,
            { code: "connection_error", cause: error }
          );
        }
        await sleep(wait, call.signal);
        continue;
      } finally {
        clearTimeout(timer);
        unlink();
      }
      const json = parseJson(text);
      if (response.ok) return { status: response.status, headers: response.headers, body: json };
      if (response.status === 503 && call.idempotent) {
        const wait = pause(
          attempt,
          `the broker at ${this.config.baseUrl} is unavailable (503)`,
          response.headers.get("retry-after")
        );
        if (wait !== null) {
          await sleep(wait, call.signal);
          continue;
        }
      }
      const asked = response.headers.get("retry-after");
      if (response.status === 429 && asked !== null && /^\d+$/.test(asked) && Number(asked) * 1e3 <= this.config.maxBackoff) {
        const wait = pause(attempt, `the broker at ${this.config.baseUrl} is rate limited`, asked);
        if (wait !== null) {
          await sleep(wait, call.signal);
          continue;
        }
      }
      throw errorFromReply(response.status, response.statusText, json, response.headers);
    }
  }
};
async function corsRefusal(error, config) {
  const origin = globalThis.location?.origin;
  if (!(error instanceof TypeError) || !origin || origin === "null") return null;
  let target;
  try {
    target = new URL(config.baseUrl);
  } catch {
    return null;
  }
  if (target.origin === origin) return null;
  try {
    await config.fetch(`${config.baseUrl}/healthz`, { mode: "no-cors", cache: "no-store" });
  } catch {
    return null;
  }
  return new CorsRefusedError(
    `the broker at ${config.baseUrl} does not allow this page's origin ${origin}: add it to the broker's MEMP_CORS_ORIGINS`,
    { code: "cors_refused", cause: error }
  );
}
function parseJson(text) {
  if (text === "") return null;
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
function notSent(error) {
  const cause = error?.cause;
  return cause?.code === "ECONNREFUSED";
}
function certificateError(error, config) {
  const refused = unverified(error);
  if (!refused) return null;
  const trust = config.trust ? `${config.trust} does not vouch for it` : "pass the `ca` option or set MEMP_CA_BUNDLE to the CA that signed it";
  return new ConnectionFailedError(
    `could not verify the certificate of the broker at ${config.baseUrl}: ${refused.message}; ${trust}`,
    { code: "connection_error", cause: error }
  );
}
function describe(error) {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause;
  const reason = cause instanceof Error ? `${error.message} (${cause.message})` : error.message;
  return reason || error.name;
}
function link(source, target) {
  if (!source) return () => {
  };
  if (source.aborted) {
    target.abort(source.reason);
    return () => {
    };
  }
  const abort = () => target.abort(source.reason);
  source.addEventListener("abort", abort, { once: true });
  return () => source.removeEventListener("abort", abort);
}
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const done = () => {
      signal?.removeEventListener("abort", abort);
      resolve();
    };
    const timer = setTimeout(done, ms);
    const abort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal?.addEventListener("abort", abort, { once: true });
  });
}

// src/agents.ts
var Agents = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  async get(agentId, options = {}) {
    return toAgent(await getResource(this.transport, this.client, options, ["agents", agentId]));
  }
  async list(options = {}) {
    const body = await getResource(this.transport, this.client, options, ["agents"], pageQuery(options));
    return { agents: body.agents.map(toAgent), nextCursor: body.next_cursor ?? null };
  }
  /** Remove an agent: its record goes and every key bound to it is revoked. */
  async remove(agentId, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    await this.transport.send({
      method: "DELETE",
      path: namespacePath(namespace, "agents", agentId),
      idempotent: false,
      signal: options.signal
    });
  }
};
function toReply(wire) {
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
    error: wire.error ? errorFromReply(0, "", { error: wire.error }) : null
  };
}
var Messages = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  /** Run the messages in order, one reply each; an `error` reply does not stop the rest. */
  async batch(messages, options = {}) {
    const namespace = this.client.namespace;
    const body = messages.map((message) => ({
      memp: "1.0",
      ...message,
      namespace: message.namespace ?? namespace ?? void 0,
      id: message.id ?? messageId()
    }));
    const reply = await this.transport.send({
      method: "POST",
      path: "/v1/messages",
      body,
      idempotent: true,
      signal: options.signal
    });
    return reply.body.map(toReply);
  }
};

// src/governance.ts
function bound(value) {
  return value instanceof Date ? value.getTime() : value;
}
var Proposals = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  /** One page, newest first; pass `next_cursor` back as `cursor`. */
  async list(options = {}) {
    const query = { status: options.status, key: options.key, ...pageQuery(options) };
    return await getResource(this.transport, this.client, options, ["proposals"], query);
  }
  /** A proposal with its diff. */
  async get(proposalId, options = {}) {
    return await getResource(this.transport, this.client, options, ["proposals", proposalId]);
  }
  /**
   * Write the proposal. If the key moved since, ConflictError's details carry `current`,
   * `current_version` and a fresh `diff`; approve again with `baseVersion` set to
   * `current_version` to apply it rebased.
   */
  async approve(proposalId, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const reply = await this.transport.send({
      method: "POST",
      path: namespacePath(namespace, "proposals", proposalId, "approve"),
      body: options.baseVersion == null ? {} : { base_version: options.baseVersion },
      idempotent: false,
      signal: options.signal
    });
    const body = reply.body;
    return { proposal: body.proposal, entry: toEntry(body.entry) };
  }
  /** Close the proposal for good, with a reason. */
  async reject(proposalId, reason = "", options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const reply = await this.transport.send({
      method: "POST",
      path: namespacePath(namespace, "proposals", proposalId, "reject"),
      body: { reason },
      idempotent: false,
      signal: options.signal
    });
    return reply.body;
  }
};
var Audit = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  /** One page, newest first; pass `next_cursor` back as `cursor`. */
  async list(options = {}) {
    const query = {
      since: bound(options.since),
      until: bound(options.until),
      actor: options.actor,
      key: options.key,
      action: options.action,
      after: options.after,
      ...pageQuery(options)
    };
    return await getResource(this.transport, this.client, options, ["audit"], query);
  }
  /** Every record of the selection, newest first, page after page. */
  async export(options = {}) {
    const records = [];
    let cursor = null;
    do {
      const page = await this.list({ ...options, cursor, limit: 1e3 });
      records.push(...page.records);
      cursor = page.next_cursor;
    } while (cursor);
    return records;
  }
  /** Walk the hash chain: `ok` is false, with `broken`, if a record was tampered with. */
  async verify(options = {}) {
    return await getResource(this.transport, this.client, options, ["audit", "verify"]);
  }
};

// src/amp.ts
function iso(moment) {
  return moment instanceof Date ? moment.toISOString() : moment;
}
function defined(fields) {
  const kept = Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== void 0));
  return Object.keys(kept).length ? kept : void 0;
}
var Amp = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  headers(agent) {
    const acting = agent ?? this.client.agent?.id;
    return acting ? { "X-AMP-Agent-ID": acting } : {};
  }
  async call(method, path, options, body, idempotent = false) {
    const reply = await this.transport.send({
      method,
      path,
      body,
      headers: this.headers(options.agent),
      idempotent,
      signal: options.signal
    });
    return reply.body;
  }
  /**
   * Create a cell; the broker sets its id, creator (the acting agent) and lifecycle.
   * `near_duplicates` lists the owner's cells that say nearly the same, to `merge` with.
   */
  async create(text, options) {
    const body = defined({
      type: options.type ?? "semantic",
      content: { text, metadata: options.metadata ?? {} },
      identity: defined({
        owner_id: options.ownerId,
        owner_type: options.ownerType ?? "user",
        session_id: options.sessionId
      }),
      scoring: defined({
        importance: options.importance,
        confidence: options.confidence,
        decay_rate: options.decayRate
      }),
      access_policy: options.accessPolicy,
      provenance: options.provenance,
      expires_at: iso(options.expiresAt)
    });
    return this.call("POST", "/amp/memories", options, body);
  }
  /** Read a cell (a read counts as an access and restarts its decay). */
  async get(id, options = {}) {
    return this.call("GET", `/amp/memories/${encodeURIComponent(id)}`, options, void 0, true);
  }
  /** Change what is given; an archived cell refuses (ConflictError, `cellStatus`). */
  async patch(id, options) {
    const body = defined({
      content: defined({ text: options.text, metadata: options.metadata }),
      scoring: defined({
        importance: options.importance,
        confidence: options.confidence,
        decay_rate: options.decayRate
      }),
      access_policy: options.accessPolicy,
      expires_at: iso(options.expiresAt)
    }) ?? {};
    return this.call("PATCH", `/amp/memories/${encodeURIComponent(id)}`, options, body);
  }
  /** Soft-delete an archived cell (others: ConflictError naming their status). */
  async delete(id, options = {}) {
    return this.call("DELETE", `/amp/memories/${encodeURIComponent(id)}`, options);
  }
  /** Cells the acting agent may read, best first; pass `nextCursor` back as `cursor`. */
  async search(options = {}) {
    const body = defined({
      query: options.query,
      owner_id: options.ownerId,
      owner_type: options.ownerType,
      types: options.types,
      status: options.status,
      include_stale: options.includeStale || void 0,
      metadata: options.metadata,
      created_after: iso(options.createdAfter),
      created_before: iso(options.createdBefore),
      limit: options.limit,
      cursor: options.cursor,
      mode: options.mode,
      min_score: options.minScore
    }) ?? {};
    const page = await this.call("POST", "/amp/memories/search", options, body, true);
    const found = {
      results: page.results.map((hit) => ({
        cell: hit.cell,
        score: hit.score,
        decayScore: hit.decay_score
      })),
      nextCursor: page.next_cursor ?? null
    };
    if (page.degraded !== void 0) found.degraded = page.degraded;
    return found;
  }
  /**
   * One new cell of the sources' owner from 2 to 50 cells the agent may write, which become
   * archived; its provenance names them. A source already archived (another merge won)
   * rejects with ConflictError.
   */
  async merge(ids, text, options = {}) {
    const body = defined({
      ids,
      text,
      type: options.type,
      metadata: options.metadata,
      scoring: defined({
        importance: options.importance,
        confidence: options.confidence,
        decay_rate: options.decayRate
      }),
      access_policy: options.accessPolicy
    });
    return this.call("POST", "/amp/memories/merge", options, body);
  }
  /** Store cells from another system as they are (needs `admin` on the AMP namespace). */
  async importCells(cells, options = {}) {
    const plain = cells.map((cell) => {
      const { near_duplicates: _, ...rest } = cell;
      return rest;
    });
    return this.call("POST", "/amp/import", options, { cells: plain });
  }
};

// src/namespaces.ts
function toSchema(wire) {
  return {
    id: wire.id,
    namespace: wire.namespace,
    pattern: wire.pattern,
    schema: wire.schema,
    enforce: wire.enforce,
    draft: wire.draft,
    createdAt: wire.created_at,
    createdBy: wire.created_by
  };
}
var CONFIG_FIELDS = [
  "strategy",
  "rules",
  "priorities",
  "default_priority",
  "merge_arrays",
  "history_limit",
  "default_ttl_seconds",
  "shares",
  "limits",
  "allow_self_approval"
];
var Namespaces = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  /** The configuration, with its `revision` (0 and the defaults if never set). */
  async config(options = {}) {
    return await getResource(this.transport, this.client, options, ["config"]);
  }
  /** The namespace's usage (live keys, stored bytes, open streams) beside its limits and the
   * broker's per-agent defaults. */
  async usage(options = {}) {
    return await getResource(this.transport, this.client, options, ["usage"]);
  }
  /** Replace the configuration (fields left out take their defaults); with `ifRevision`,
   * only while the stored one is that revision, else PreconditionFailedError. */
  async setConfig(config, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const body = {};
    for (const field of CONFIG_FIELDS) if (config[field] !== void 0) body[field] = config[field];
    const headers = {};
    if (options.ifRevision !== void 0) headers["If-Match"] = `"${options.ifRevision}"`;
    const reply = await this.transport.send({
      method: "PUT",
      path: namespacePath(namespace, "config"),
      body,
      headers,
      idempotent: options.ifRevision === void 0,
      signal: options.signal
    });
    return reply.body;
  }
  /** Change only the fields given and keep the rest (re-reading if raced). */
  async updateConfig(changes, options = {}) {
    for (let attempt = 1; ; attempt++) {
      const current = await this.config(options);
      const merged = {};
      for (const field of CONFIG_FIELDS) {
        ;
        merged[field] = changes[field] !== void 0 ? changes[field] : current[field];
      }
      try {
        return await this.setConfig(merged, { ...options, ifRevision: current.revision });
      } catch (error) {
        if (attempt >= 5 || error.code !== "precondition_failed") throw error;
      }
    }
  }
};
var Schemas = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  /** Register (or replace) schema `id` for keys matching `pattern`. */
  async put(id, pattern, schema, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const reply = await this.transport.send({
      method: "PUT",
      path: namespacePath(namespace, "schemas", id),
      body: { pattern, schema, enforce: options.enforce ?? false },
      idempotent: true,
      signal: options.signal
    });
    return toSchema(reply.body);
  }
  async get(id, options = {}) {
    return toSchema(await getResource(this.transport, this.client, options, ["schemas", id]));
  }
  async delete(id, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    await this.transport.send({
      method: "DELETE",
      path: namespacePath(namespace, "schemas", id),
      idempotent: false,
      signal: options.signal
    });
  }
  async list(options = {}) {
    const body = await getResource(this.transport, this.client, options, ["schemas"]);
    return body.schemas.map(toSchema);
  }
};

// src/query.ts
var QueryResult = class {
  constructor(namespace, pattern, fetchPage) {
    this.namespace = namespace;
    this.pattern = pattern;
    this.fetchPage = fetchPage;
  }
  namespace;
  pattern;
  fetchPage;
  #all = null;
  /** Every page, following `nextCursor` until the broker says there is no more. */
  async *pages() {
    let cursor = null;
    do {
      const page = await this.fetchPage(cursor);
      yield page;
      cursor = page.nextCursor;
    } while (cursor !== null);
  }
  async *[Symbol.asyncIterator]() {
    for await (const page of this.pages()) yield* page.entries;
  }
  /** Every matching entry, in key order (fetches every page once; later calls reuse it). */
  toArray() {
    if (this.#all === null) {
      this.#all = (async () => {
        const entries = [];
        for await (const page of this.pages()) entries.push(...page.entries);
        return entries;
      })();
      this.#all.catch(() => {
        this.#all = null;
      });
    }
    return this.#all;
  }
  /** Key → value for every matching entry. */
  async values() {
    const values = {};
    for (const entry of await this.toArray()) values[entry.key] = entry.value;
    return values;
  }
  then(onfulfilled, onrejected) {
    return this.toArray().then(onfulfilled, onrejected);
  }
  catch(onrejected) {
    return this.toArray().catch(onrejected);
  }
};

// node_modules/eventsource-parser/dist/index.js
var ParseError = class extends Error {
  constructor(message, options) {
    super(message), this.name = "ParseError", this.type = options.type, this.field = options.field, this.value = options.value, this.line = options.line;
  }
};
var LF = 10;
var CR = 13;
var SPACE = 32;
function noop(_arg) {
}
function createParser(config) {
  if (typeof config == "function")
    throw new TypeError(
      "`config` must be an object, got a function instead. Did you mean `createParser({onEvent: fn})`?"
    );
  const { onEvent = noop, onError = noop, onRetry = noop, onComment, maxBufferSize } = config, pendingFragments = [];
  let pendingFragmentsLength = 0, isFirstChunk = true, id, data = "", dataLines = 0, eventType, terminated = false;
  function feed(chunk) {
    if (terminated)
      throw new Error(
        "Cannot feed parser: it was terminated after exceeding the configured max buffer size. Call `reset()` to resume parsing."
      );
    if (isFirstChunk && (isFirstChunk = false, chunk.charCodeAt(0) === 239 && chunk.charCodeAt(1) === 187 && chunk.charCodeAt(2) === 191 && (chunk = chunk.slice(3))), pendingFragments.length === 0) {
      const trailing2 = processLines(chunk);
      trailing2 !== "" && (pendingFragments.push(trailing2), pendingFragmentsLength = trailing2.length), checkBufferSize();
      return;
    }
    if (chunk.indexOf(`
`) === -1 && chunk.indexOf("\r") === -1) {
      pendingFragments.push(chunk), pendingFragmentsLength += chunk.length, checkBufferSize();
      return;
    }
    pendingFragments.push(chunk);
    const input = pendingFragments.join("");
    pendingFragments.length = 0, pendingFragmentsLength = 0;
    const trailing = processLines(input);
    trailing !== "" && (pendingFragments.push(trailing), pendingFragmentsLength = trailing.length), checkBufferSize();
  }
  function checkBufferSize() {
    maxBufferSize !== void 0 && (pendingFragmentsLength + data.length <= maxBufferSize || (terminated = true, pendingFragments.length = 0, pendingFragmentsLength = 0, id = void 0, data = "", dataLines = 0, eventType = void 0, onError(
      new ParseError(`Buffered data exceeded max buffer size of ${maxBufferSize} characters`, {
        type: "max-buffer-size-exceeded"
      })
    )));
  }
  function processLines(chunk) {
    let searchIndex = 0;
    if (chunk.indexOf("\r") === -1) {
      let lfIndex = chunk.indexOf(`
`, searchIndex);
      for (; lfIndex !== -1; ) {
        if (searchIndex === lfIndex) {
          dataLines > 0 && onEvent({ id, event: eventType, data }), id = void 0, data = "", dataLines = 0, eventType = void 0, searchIndex = lfIndex + 1, lfIndex = chunk.indexOf(`
`, searchIndex);
          continue;
        }
        const firstCharCode = chunk.charCodeAt(searchIndex);
        if (isDataPrefix(chunk, searchIndex, firstCharCode)) {
          const valueStart = chunk.charCodeAt(searchIndex + 5) === SPACE ? searchIndex + 6 : searchIndex + 5, value = chunk.slice(valueStart, lfIndex);
          if (dataLines === 0 && chunk.charCodeAt(lfIndex + 1) === LF) {
            onEvent({ id, event: eventType, data: value }), id = void 0, data = "", eventType = void 0, searchIndex = lfIndex + 2, lfIndex = chunk.indexOf(`
`, searchIndex);
            continue;
          }
          data = dataLines === 0 ? value : `${data}
${value}`, dataLines++;
        } else isEventPrefix(chunk, searchIndex, firstCharCode) ? eventType = chunk.slice(
          chunk.charCodeAt(searchIndex + 6) === SPACE ? searchIndex + 7 : searchIndex + 6,
          lfIndex
        ) || void 0 : parseLine(chunk, searchIndex, lfIndex);
        searchIndex = lfIndex + 1, lfIndex = chunk.indexOf(`
`, searchIndex);
      }
      return chunk.slice(searchIndex);
    }
    for (; searchIndex < chunk.length; ) {
      const crIndex = chunk.indexOf("\r", searchIndex), lfIndex = chunk.indexOf(`
`, searchIndex);
      let lineEnd = -1;
      if (crIndex !== -1 && lfIndex !== -1 ? lineEnd = crIndex < lfIndex ? crIndex : lfIndex : crIndex !== -1 ? crIndex === chunk.length - 1 ? lineEnd = -1 : lineEnd = crIndex : lfIndex !== -1 && (lineEnd = lfIndex), lineEnd === -1)
        break;
      parseLine(chunk, searchIndex, lineEnd), searchIndex = lineEnd + 1, chunk.charCodeAt(searchIndex - 1) === CR && chunk.charCodeAt(searchIndex) === LF && searchIndex++;
    }
    return chunk.slice(searchIndex);
  }
  function parseLine(chunk, start, end) {
    if (start === end) {
      dispatchEvent();
      return;
    }
    const firstCharCode = chunk.charCodeAt(start);
    if (isDataPrefix(chunk, start, firstCharCode)) {
      const valueStart = chunk.charCodeAt(start + 5) === SPACE ? start + 6 : start + 5, value2 = chunk.slice(valueStart, end);
      data = dataLines === 0 ? value2 : `${data}
${value2}`, dataLines++;
      return;
    }
    if (isEventPrefix(chunk, start, firstCharCode)) {
      eventType = chunk.slice(chunk.charCodeAt(start + 6) === SPACE ? start + 7 : start + 6, end) || void 0;
      return;
    }
    if (firstCharCode === 105 && chunk.charCodeAt(start + 1) === 100 && chunk.charCodeAt(start + 2) === 58) {
      const value2 = chunk.slice(chunk.charCodeAt(start + 3) === SPACE ? start + 4 : start + 3, end);
      value2.includes("\0") || (id = value2);
      return;
    }
    if (firstCharCode === 58) {
      if (onComment) {
        const line2 = chunk.slice(start, end);
        onComment(line2.slice(chunk.charCodeAt(start + 1) === SPACE ? 2 : 1));
      }
      return;
    }
    const line = chunk.slice(start, end), fieldSeparatorIndex = line.indexOf(":");
    if (fieldSeparatorIndex === -1) {
      processField(line, "", line);
      return;
    }
    const field = line.slice(0, fieldSeparatorIndex), offset = line.charCodeAt(fieldSeparatorIndex + 1) === SPACE ? 2 : 1, value = line.slice(fieldSeparatorIndex + offset);
    processField(field, value, line);
  }
  function processField(field, value, line) {
    switch (field) {
      case "event":
        eventType = value || void 0;
        break;
      case "data":
        data = dataLines === 0 ? value : `${data}
${value}`, dataLines++;
        break;
      case "id":
        value.includes("\0") || (id = value);
        break;
      case "retry":
        /^\d+$/.test(value) ? onRetry(parseInt(value, 10)) : onError(
          new ParseError(`Invalid \`retry\` value: "${value}"`, {
            type: "invalid-retry",
            value,
            line
          })
        );
        break;
      default:
        onError(
          new ParseError(
            `Unknown field "${field.length > 20 ? `${field.slice(0, 20)}\u2026` : field}"`,
            { type: "unknown-field", field, value, line }
          )
        );
        break;
    }
  }
  function dispatchEvent() {
    dataLines > 0 && onEvent({
      id,
      event: eventType,
      data
    }), id = void 0, data = "", dataLines = 0, eventType = void 0;
  }
  function reset(options = {}) {
    if (options.consume && pendingFragments.length > 0) {
      const incompleteLine = pendingFragments.join("");
      parseLine(incompleteLine, 0, incompleteLine.length);
    }
    isFirstChunk = true, id = void 0, data = "", dataLines = 0, eventType = void 0, pendingFragments.length = 0, pendingFragmentsLength = 0, terminated = false;
  }
  return { feed, reset };
}
function isDataPrefix(chunk, i, firstCharCode) {
  return firstCharCode === 100 && chunk.charCodeAt(i + 1) === 97 && chunk.charCodeAt(i + 2) === 116 && chunk.charCodeAt(i + 3) === 97 && chunk.charCodeAt(i + 4) === 58;
}
function isEventPrefix(chunk, i, firstCharCode) {
  return firstCharCode === 101 && chunk.charCodeAt(i + 1) === 118 && chunk.charCodeAt(i + 2) === 101 && chunk.charCodeAt(i + 3) === 110 && chunk.charCodeAt(i + 4) === 116 && chunk.charCodeAt(i + 5) === 58;
}

// src/subscription.ts
function streamOptions(options) {
  const found = [];
  if (options.filter) found.push(["filter", options.filter]);
  if (options.conflate !== void 0) found.push(["conflate", options.conflate]);
  if (options.maxRate !== void 0) found.push(["max_rate", String(options.maxRate)]);
  return found;
}
var ENTRY_EVENTS = /* @__PURE__ */ new Set(["put", "delete", "expire", "snapshot"]);
var RESUME_EVENTS = new Set(END_EVENT_TYPES);
var OPENED = /* @__PURE__ */ Symbol("opened");
var StreamState = class {
  constructor(namespace, patterns, snapshot, lastEventId, onState, options = []) {
    this.namespace = namespace;
    this.patterns = patterns;
    this.onState = onState;
    this.options = options;
    this.cursor = lastEventId || null;
    this.snapshotPending = snapshot && this.cursor === null;
  }
  namespace;
  patterns;
  onState;
  options;
  cursor;
  snapshotPending;
  /** Snapshot entries handed out, so a snapshot asked for again after a break skips them. */
  snapshotSent = /* @__PURE__ */ new Set();
  /** Connection attempts in a row that delivered nothing. */
  failures = 0;
  /** Reconnection attempts since the last event (the first is 1). */
  retries = 0;
  /** This connection delivered an event. */
  live = false;
  /** The broker ended the stream and asked to be resumed. */
  resumeNow = false;
  /** Connection attempts made so far. */
  attempts = 0;
  /** Streams opened so far. */
  connections = 0;
  /** What ended the last attempt. */
  error = null;
  status = null;
  query() {
    this.live = false;
    this.attempts += 1;
    const params = new URLSearchParams({ namespace: this.namespace });
    for (const pattern of this.patterns) params.append("pattern", pattern);
    if (this.snapshotPending) params.append("snapshot", "1");
    for (const [name, value] of this.options) params.append(name, value);
    return params;
  }
  headers() {
    const headers = { Accept: "text/event-stream" };
    if (this.cursor !== null) headers["Last-Event-ID"] = this.cursor;
    return headers;
  }
  /** The connection closed or failed. */
  ended() {
    if (!this.live) this.failures += 1;
  }
  /** Tell the listener where the connection stands (each change once). */
  report(status, error = null) {
    if (status === this.status && status !== "reconnecting") return;
    this.status = status;
    const attempt = status === "reconnecting" ? this.retries : 0;
    try {
      this.onState?.({ status, attempt, error });
    } catch {
    }
  }
  attempting() {
    const first = this.connections === 0 && this.failures === 0;
    if (!first) this.retries += 1;
    this.report(first ? "connecting" : "reconnecting", first ? null : this.error);
  }
  /** No wait after a stream that worked or asked to be resumed; backoff after failures. */
  delay(transport) {
    if (this.resumeNow || this.failures === 0) {
      this.resumeNow = false;
      return 0;
    }
    return transport.delay(this.failures - 1);
  }
  /** The event to hand out for one message, or null (resume markers, snapshot entries already
   * handed out before a reconnect, event types this SDK does not know). */
  handle(message) {
    const kind = message.event;
    if (!kind) return null;
    this.live = true;
    this.failures = 0;
    this.retries = 0;
    if (message.id) this.cursor = message.id;
    if (ENTRY_EVENTS.has(kind)) {
      const entry = toEntry(decode(message.data, kind));
      if (kind !== "snapshot") return event(kind, this.cursor, entry.namespace, entry);
      const seen = `${entry.namespace}\0${entry.key}\0${entry.version}`;
      if (this.snapshotSent.has(seen)) return null;
      this.snapshotSent.add(seen);
      return event("snapshot", null, entry.namespace, entry);
    }
    if (kind !== "snapshot-end" && kind !== "reset" && !RESUME_EVENTS.has(kind)) return null;
    const marker = message.data ? decode(message.data, kind) : {};
    if (marker.cursor) this.cursor = marker.cursor;
    if (RESUME_EVENTS.has(kind)) {
      this.resumeNow = true;
      return null;
    }
    if (kind === "snapshot-end") {
      this.snapshotPending = false;
      this.snapshotSent.clear();
      return event("snapshot-end", this.cursor, null, null);
    }
    return event("reset", this.cursor, marker.namespace ?? null, null, marker.reason ?? null);
  }
};
function event(type, id, namespace, entry, reason = null) {
  return {
    type,
    id,
    namespace,
    entry,
    key: entry?.key ?? null,
    value: entry?.value ?? null,
    version: entry?.version ?? null,
    reason,
    warnings: entry?.warnings ?? []
  };
}
function decode(data, kind) {
  try {
    return JSON.parse(data);
  } catch (error) {
    throw new MempError(`the broker sent a ${kind} event that is not JSON`, {
      code: "invalid_event",
      cause: error
    });
  }
}
function fatal(status) {
  return status < 500 && status !== 408 && status !== 429;
}
var Subscription = class {
  #transport;
  #state;
  #stop = new AbortController();
  #items;
  #onClose;
  #unlinkSignal = () => {
  };
  #opened = false;
  /** Made by `MEMP.subscribe`. */
  constructor(transport, state, signal, onClose = () => {
  }) {
    this.#transport = transport;
    this.#state = state;
    this.#onClose = onClose;
    this.#items = this.#run();
    if (signal) {
      const close = () => this.close();
      if (signal.aborted) close();
      else {
        signal.addEventListener("abort", close, { once: true });
        this.#unlinkSignal = () => signal.removeEventListener("abort", close);
      }
    }
  }
  /** The cursor to resume from: pass it as `lastEventId` to a later subscribe. */
  get lastEventId() {
    return this.#state.cursor;
  }
  /** Connection attempts made so far (1 while the first connection holds). */
  get attempts() {
    return this.#state.attempts;
  }
  get closed() {
    return this.#stop.signal.aborted;
  }
  /**
   * Connect now (retrying with backoff while the broker is unreachable) and resolve once the
   * stream is open: every change made after that is delivered. Call it before iterating.
   */
  async open(options = {}) {
    if (!this.#opened) {
      let timer;
      const pending = this.#items.next();
      const expired = new Promise((resolve) => {
        if (options.timeout !== void 0) timer = setTimeout(() => resolve("expired"), options.timeout);
      });
      let item;
      try {
        item = await Promise.race([pending, expired]);
      } catch (error) {
        this.close();
        throw error;
      } finally {
        clearTimeout(timer);
      }
      if (item === "expired") {
        const last = this.#state.error;
        const error = new OpenTimeoutError(
          `the event stream at ${this.#transport.config.baseUrl} did not open within ${options.timeout} ms` + (last ? `: ${describeError(last)}` : ""),
          { code: "connection_error", cause: last ?? void 0 }
        );
        this.#state.report("closed", error);
        this.close();
        pending.catch(() => {
        });
        throw error;
      }
      if (!item.done && item.value !== OPENED) {
        throw new Error("open() must be called before the subscription is iterated");
      }
      if (item.done) throw new ConnectionFailedError("the subscription was closed before it opened", { code: "connection_error" });
      this.#opened = true;
    }
    return this;
  }
  async next() {
    for (; ; ) {
      let item;
      try {
        item = await this.#items.next();
      } catch (error) {
        this.close();
        throw error;
      }
      if (item.done) {
        this.close();
        return { done: true, value: void 0 };
      }
      if (item.value === OPENED) {
        this.#opened = true;
        continue;
      }
      return { done: false, value: item.value };
    }
  }
  /** What `break` calls: ends the subscription. */
  async return() {
    this.close();
    await this.#items.return(void 0).catch(() => {
    });
    return { done: true, value: void 0 };
  }
  [Symbol.asyncIterator]() {
    return this;
  }
  /** End the subscription: the connection is closed and a pending `next()` finishes. */
  close() {
    if (this.#stop.signal.aborted) return;
    this.#stop.abort();
    this.#unlinkSignal();
    this.#onClose();
    this.#items.return(void 0).catch(() => {
    });
  }
  async *#run() {
    const transport = this.#transport;
    const config = transport.config;
    const state = this.#state;
    const stop = this.#stop.signal;
    try {
      yield* this.#connections(transport, config, state, stop);
    } catch (error) {
      state.report("closed", error);
      throw error;
    } finally {
      state.report("closed", null);
    }
  }
  async *#connections(transport, config, state, stop) {
    while (!stop.aborted) {
      state.attempting();
      const connection = new AbortController();
      const unlink = link(stop, connection);
      let timer;
      const arm = () => {
        clearTimeout(timer);
        timer = setTimeout(
          () => connection.abort(new DOMException("the stream went silent", "TimeoutError")),
          config.streamTimeout
        );
      };
      let reader;
      try {
        arm();
        const response = await config.fetch(transport.url("/v1/subscribe", state.query()), {
          headers: transport.headers(state.headers()),
          signal: connection.signal,
          cache: "no-store"
        });
        if (response.status !== 200) {
          const text = await response.text();
          const refusal = errorFromReply(
            response.status,
            response.statusText,
            parseJson(text),
            response.headers
          );
          if (fatal(response.status)) throw refusal;
          state.error = refusal;
        } else if (!response.body || !isEventStream(response)) {
          throw new ConnectionFailedError(
            `${config.baseUrl} did not answer with an event stream`,
            { code: "connection_error", status: response.status }
          );
        } else {
          reader = response.body.getReader();
          const decoder = new TextDecoder();
          const messages = [];
          const parser = createParser({ onEvent: (message) => messages.push(message) });
          let opened = false;
          for (; ; ) {
            arm();
            const { done, value } = await reader.read();
            if (done) break;
            if (!opened) {
              opened = true;
              state.connections += 1;
              state.report("connected");
              yield OPENED;
            }
            parser.feed(decoder.decode(value, { stream: true }));
            while (messages.length > 0) {
              const item = state.handle(messages.shift());
              if (item !== null) yield item;
              if (stop.aborted) return;
            }
          }
          state.error = new ConnectionFailedError("the broker ended the stream", {
            code: "connection_error"
          });
        }
      } catch (error) {
        if (stop.aborted) return;
        if (error instanceof MempError) throw error;
        const refused = certificateError(error, config) ?? await corsRefusal(error, config);
        if (refused) throw refused;
        state.error = error;
      } finally {
        clearTimeout(timer);
        unlink();
        connection.abort();
        reader?.cancel().catch(() => {
        });
      }
      state.ended();
      try {
        await sleep(state.delay(transport), stop);
      } catch {
        return;
      }
    }
  }
};
function describeError(error) {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause;
  return cause instanceof Error ? `${error.message} (${cause.message})` : error.message;
}
function isEventStream(response) {
  return (response.headers.get("content-type") ?? "").startsWith("text/event-stream");
}

// src/client.ts
function entryPath(kind, namespace, key) {
  const segments = key.split("/");
  if (key === "" || segments.some((s) => s === "" || s === "." || s === "..")) {
    throw new InvalidRequestError(
      `key ${JSON.stringify(key)} has an empty, '.' or '..' segment (refused by the SDK)`,
      { code: "invalid_key", status: 400, details: { key } }
    );
  }
  return `${namespacePath(namespace)}/${kind}/${segments.map(encodeURIComponent).join("/")}`;
}
function millis(timestamp) {
  return timestamp instanceof Date ? timestamp.getTime() : timestamp;
}
function entryOf(reply) {
  if (reply.status === 202) throw new ApprovalPendingError(reply.body);
  return toEntry(reply.body, parseWarnings(reply.headers.get("memp-warning")));
}
var Memory = class {
  constructor(transport, client) {
    this.transport = transport;
    this.client = client;
  }
  transport;
  client;
  /** Store `value` under `key`; resolves to the entry written (with `warnings`). */
  async put(key, value, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const body = { value };
    if (options.ttlSeconds != null) body["ttl_seconds"] = options.ttlSeconds;
    if (options.baseVersion != null) body["base_version"] = options.baseVersion;
    if (options.timestamp != null) body["timestamp"] = millis(options.timestamp);
    if (options.approvalRequired) body["approval_required"] = true;
    const headers = { "Idempotency-Key": messageId() };
    if (options.ifVersion != null) headers["If-Match"] = `"${options.ifVersion}"`;
    if (options.ifAbsent) headers["If-None-Match"] = "*";
    const reply = await this.transport.send({
      method: "PUT",
      path: entryPath("memory", namespace, key),
      headers,
      body,
      idempotent: true,
      signal: options.signal
    });
    return entryOf(reply);
  }
  /** The value under `key` (NotFoundError when there is none). */
  async get(key, options = {}) {
    return (await this.getEntry(key, options)).value;
  }
  /** The entry under `key`, with its version and metadata. */
  async getEntry(key, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const reply = await this.transport.send({
      method: "GET",
      path: entryPath("memory", namespace, key),
      idempotent: true,
      signal: options.signal
    });
    return entryOf(reply);
  }
  /**
   * Entries whose keys match `pattern` (`customer/*`, `*` for all). `await` it for every
   * matching entry, or `for await` over it to fetch page by page.
   */
  query(pattern = "*", options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    return new QueryResult(
      namespace,
      pattern,
      (cursor) => this.page(pattern, { namespace, cursor, limit: options.pageSize, signal: options.signal })
    );
  }
  /** One page of a query, for callers that keep the cursor themselves. */
  async page(pattern = "*", options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const reply = await this.transport.send({
      method: "GET",
      path: `${namespacePath(namespace)}/memory`,
      query: { pattern, ...pageQuery(options) },
      idempotent: true,
      signal: options.signal
    });
    const body = reply.body;
    return {
      entries: body.entries.map((entry) => toEntry(entry)),
      nextCursor: body.next_cursor ?? null
    };
  }
  /** Delete `key`; resolves to the tombstone version. */
  async delete(key, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const headers = { "Idempotency-Key": messageId() };
    if (options.ifVersion != null) headers["If-Match"] = `"${options.ifVersion}"`;
    const reply = await this.transport.send({
      method: "DELETE",
      path: entryPath("memory", namespace, key),
      query: {
        timestamp: millis(options.timestamp),
        approval_required: options.approvalRequired ? "true" : void 0
      },
      headers,
      idempotent: true,
      signal: options.signal
    });
    return entryOf(reply);
  }
  /** The key's recent versions, newest first, tombstones included. */
  async history(key, options = {}) {
    const namespace = this.client.requireNamespace(options.namespace);
    const reply = await this.transport.send({
      method: "GET",
      path: entryPath("history", namespace, key),
      query: { limit: options.limit },
      idempotent: true,
      signal: options.signal
    });
    return reply.body.versions.map((entry) => toEntry(entry));
  }
};
var Keys = class {
  constructor(transport) {
    this.transport = transport;
  }
  transport;
  async create(options) {
    const body = { grants: options.grants, name: options.name ?? "" };
    if (options.agentId !== void 0) body["agent_id"] = options.agentId;
    const reply = await this.transport.send({
      method: "POST",
      path: "/v1/keys",
      body,
      idempotent: false,
      signal: options.signal
    });
    const created = reply.body;
    return { apiKey: created.api_key, key: toApiKey(created.key) };
  }
  async list(options = {}) {
    const reply = await this.transport.send({
      method: "GET",
      path: "/v1/keys",
      idempotent: true,
      signal: options.signal
    });
    return reply.body.keys.map(toApiKey);
  }
  async revoke(keyId, options = {}) {
    await this.transport.send({
      method: "DELETE",
      path: `/v1/keys/${encodeURIComponent(keyId)}`,
      idempotent: false,
      signal: options.signal
    });
  }
};
var MEMP = class {
  config;
  memory;
  keys;
  namespaces;
  schemas;
  agents;
  messages;
  proposals;
  audit;
  amp;
  /** The agent registered with `register()`. */
  agent = null;
  /** The credentials `register()` returned; the API key is shown only once. */
  credentials = null;
  #transport;
  #subscriptions = /* @__PURE__ */ new Set();
  constructor(options = {}) {
    this.config = resolveConfig(options);
    this.#transport = new Transport(this.config);
    this.memory = new Memory(this.#transport, this);
    this.keys = new Keys(this.#transport);
    this.namespaces = new Namespaces(this.#transport, this);
    this.schemas = new Schemas(this.#transport, this);
    this.agents = new Agents(this.#transport, this);
    this.messages = new Messages(this.#transport, this);
    this.proposals = new Proposals(this.#transport, this);
    this.audit = new Audit(this.#transport, this);
    this.amp = new Amp(this.#transport, this);
  }
  get namespace() {
    return this.config.namespace;
  }
  /** The token in use (the agent's own key after `register`). */
  get apiKey() {
    return this.config.apiKey;
  }
  /** @internal */
  requireNamespace(namespace) {
    const chosen = namespace || this.config.namespace;
    if (!chosen) throw new TypeError("no namespace: pass { namespace } or set MEMP_NAMESPACE");
    return chosen;
  }
  /** Register an agent; later calls use the API key bound to it (`agent`, `credentials`). */
  async register(options) {
    const namespace = this.requireNamespace(options.namespace);
    const reply = await this.#transport.send({
      method: "POST",
      path: "/v1/agents",
      body: {
        name: options.name,
        framework: options.framework ?? "custom",
        namespace,
        ...options.new ? { new: true } : {}
      },
      headers: { "Idempotency-Key": messageId() },
      idempotent: true,
      signal: options.signal
    });
    const body = reply.body;
    this.agent = toAgent(body.agent);
    this.credentials = toCredentials(body.credentials);
    this.config.apiKey = this.credentials.apiKey;
    return this.agent;
  }
  /**
   * Events for keys matching `pattern` (or several patterns), live, as an async iterable that
   * reconnects with backoff and resumes from the last event id by itself.
   */
  subscribe(pattern = "*", options = {}) {
    const namespace = this.requireNamespace(options.namespace);
    const patterns = typeof pattern === "string" ? [pattern] : [...pattern];
    const state = new StreamState(
      namespace,
      patterns,
      options.snapshot ?? false,
      options.lastEventId ?? null,
      options.onState,
      streamOptions(options)
    );
    const open = this.#subscriptions;
    let subscription = void 0;
    subscription = new Subscription(this.#transport, state, options.signal, () => {
      if (subscription) open.delete(subscription);
    });
    if (!subscription.closed) open.add(subscription);
    return subscription;
  }
  /** End every open subscription of this client. */
  close() {
    for (const subscription of [...this.#subscriptions]) subscription.close();
  }
};
export {
  Agents,
  Amp,
  ApprovalPendingError,
  Audit,
  CURSOR_EVENT_TYPES,
  ConflictError,
  ConnectionFailedError,
  CorsRefusedError,
  DEFAULT_BASE_URL,
  END_EVENT_TYPES,
  ERROR_CODES,
  EVENT_TYPES,
  ForbiddenError,
  InvalidRequestError,
  Keys,
  MEMP,
  Memory,
  MempError,
  Messages,
  Namespaces,
  NotFoundError,
  OpenTimeoutError,
  PERMISSIONS,
  PayloadTooLargeError,
  PreconditionFailedError,
  Proposals,
  QueryResult,
  QuotaExceededError,
  RateLimitedError,
  SchemaViolationError,
  Schemas,
  Subscription,
  UnauthorizedError,
  UnavailableError,
  WARNINGS
};
