"""Changes as subscribers get them: the change-log reader, the per-process hub and its
subscribers, leases of open streams, and the end of streams whose right to exist ended."""
