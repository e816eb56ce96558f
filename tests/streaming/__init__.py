"""Tests of change-log readers, the hub, revocation (tests/README.md)."""
