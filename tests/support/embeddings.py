"""A stand-in for an OpenAI-compatible `/v1/embeddings` endpoint, served on loopback: each
text's vector counts its words hashed into a few dimensions, so texts sharing words are near.
It records the Authorization headers it gets and can be told to fail."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DIMS = 32


def stand_in_vector(text: str) -> list[float]:
    vector = [0.0] * DIMS
    for word in text.lower().split():
        vector[hashlib.sha256(word.strip("?.!,").encode()).digest()[0] % DIMS] += 1.0
    return vector


class EmbeddingsStandIn:
    """Serves POST /v1/embeddings until `stop()`; `down` makes it answer 503."""

    def __init__(self) -> None:
        self.down = False
        self.authorizations: list[str | None] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stand_in.authorizations.append(self.headers.get("Authorization"))
                body: dict[str, Any] = json.loads(self.rfile.read(
                    int(self.headers.get("Content-Length", "0"))))
                if stand_in.down or self.path != "/v1/embeddings":
                    self.send_response(503 if stand_in.down else 404)
                    self.end_headers()
                    return
                data = [{"object": "embedding", "index": i, "embedding": stand_in_vector(t)}
                        for i, t in enumerate(body["input"])]
                answer = json.dumps({"object": "list", "data": data,
                                     "model": body["model"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
