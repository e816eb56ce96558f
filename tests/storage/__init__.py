"""Tests of the store, Redis and its topologies (tests/README.md)."""
