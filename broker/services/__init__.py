"""The MEMP operations and their rules: memory, agents, namespaces (configuration, schemas,
shares), who the caller is and what it may do, fair share, the audit log, conflicts and
idempotency. Routes, messages and MCP call them with the caller's principal."""
