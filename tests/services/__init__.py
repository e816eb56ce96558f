"""Tests of the MEMP services (tests/README.md)."""
