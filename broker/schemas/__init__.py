"""JSON Schema checking that cannot stall: compiling (remote refs refused), keywords that check a
deadline, linear-time regular expressions, and the runner that validates off the event loop."""
