"""The HTTP surface: every route (MEMP's and AMP's), request and response helpers, the SSE
streams and their framing, the message endpoint, the API reference and the review console."""
