"""Helpers the tests share: brokers, clients, streams, Redis topologies, waiting. A test module
imports from here (or gets a fixture from tests/conftest.py), never from another test module."""
