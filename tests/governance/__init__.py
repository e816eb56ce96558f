"""Tests of proposals and the sweepers (tests/README.md)."""
