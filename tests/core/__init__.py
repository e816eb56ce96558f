"""Tests of the base (tests/README.md)."""
