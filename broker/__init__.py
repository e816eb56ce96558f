"""MEMP broker: shared, versioned memory for AI agents."""

__version__ = "0.1.0"
PROTOCOL_VERSION = "1.0"
