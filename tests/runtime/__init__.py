"""Tests of the process runtime (tests/README.md)."""
