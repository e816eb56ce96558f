"""Tests of the AMP bridge (tests/README.md)."""
