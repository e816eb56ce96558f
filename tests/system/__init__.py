"""Tests of the whole broker: several processes, faults, restarts, deploy/local, the README
(tests/README.md)."""
