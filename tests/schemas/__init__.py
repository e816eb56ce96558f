"""Tests of JSON Schema checking (tests/README.md)."""
