"""The process around the broker: settings, logs, metrics, the supervisor of background loops,
listening sockets, TLS and worker processes."""
