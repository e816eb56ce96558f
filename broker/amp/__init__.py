"""The AMP bridge: Agent Memory Protocol cells stored as MEMP entries (see docs/amp.md)."""
