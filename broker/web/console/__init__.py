"""The review console: static files at /console, a browser client of the public API."""
