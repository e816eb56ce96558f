/** MEMP SDK: `import { MEMP } from 'memp-sdk'` — shared, versioned memory for AI agents. */

export { MEMP, Memory, Keys } from './client.js'
export { Agents, Messages } from './agents.js'
export { Audit, Proposals } from './governance.js'
export type {
  Approval,
  AuditFilter,
  AuditPage,
  AuditRecord,
  AuditVerdict,
  Proposal,
  ProposalPage,
  ProposalStatus,
} from './governance.js'
export type { AgentPage, Message, MessageReply } from './agents.js'
export { Amp } from './amp.js'
export type {
  AccessPolicy,
  CellHit,
  CellMergeOptions,
  CreatedCell,
  CellPatchOptions,
  CellSearchOptions,
  SearchMode,
  CellSearchPage,
  CellStatus,
  ImportResult,
  MemoryCell,
  MemoryType,
  NearDuplicate,
  NewCellOptions,
  OwnerType,
  Provenance,
} from './amp.js'
export { Namespaces, Schemas } from './namespaces.js'
export type {
  Limits,
  NamespaceConfig,
  SchemaRecord,
  StoredConfig,
  Strategy,
  UsageReport,
} from './namespaces.js'
export type {
  DeleteOptions,
  HistoryOptions,
  PutOptions,
  QueryOptions,
  RegisterOptions,
} from './client.js'
export type { PageOptions } from './resources.js'
export {
  ERROR_CODES,
  ApprovalPendingError,
  ConflictError,
  ConnectionFailedError,
  CorsRefusedError,
  ForbiddenError,
  InvalidRequestError,
  MempError,
  NotFoundError,
  OpenTimeoutError,
  PayloadTooLargeError,
  PreconditionFailedError,
  QuotaExceededError,
  RateLimitedError,
  SchemaViolationError,
  UnauthorizedError,
  UnavailableError,
} from './errors.js'
export type { ErrorCode } from './errors.js'
export { CURSOR_EVENT_TYPES, END_EVENT_TYPES, EVENT_TYPES, PERMISSIONS, WARNINGS } from './models.js'
export type {
  Agent,
  ApiKey,
  Conflict,
  CreatedKey,
  Credentials,
  Entry,
  EventType,
  Grant,
  MempEvent,
  Page,
  Permission,
  SchemaError,
  Warning,
} from './models.js'
export { QueryResult } from './query.js'
export { Subscription } from './subscription.js'
export type { ConnectionState, SubscribeOptions } from './subscription.js'
export { DEFAULT_BASE_URL } from './transport.js'
export type { CallOptions, MempOptions } from './transport.js'
export type { CertificateAuthorities } from './trust.js'
