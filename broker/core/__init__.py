"""The base every layer builds on: the wire format, the error shape, the grammar of names,
canonical values, the clock and ids. It imports nothing else of the broker."""
