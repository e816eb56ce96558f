"""Embedders: text to unit vectors, for recall by meaning (docs/amp.md). `builtin` runs the
wordllama model whose weights and tokenizer ship inside its wheel, loaded once per process from
the installed files and never downloaded; `openai` calls any OpenAI-compatible
`/v1/embeddings` endpoint (OpenAI, Ollama, vLLM, text-embeddings-inference)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import msgspec
import numpy as np
import numpy.typing as npt

from broker.amp.token_ids import prepare, token_ids
from broker.runtime.settings import Settings

Vectors = npt.NDArray[np.float32]
MAX_DIMS = 8192  # a stand-in answering larger vectors is refused, not stored
BUILTIN_MODEL = "wordllama/l2_supercat-256"


class EmbedderUnavailable(Exception):
    """The embedder could not embed (down, slow, or an answer that is not embeddings)."""


class Embedder(Protocol):
    """Embeds texts as rows of unit vectors; `model` names the model with its vectors."""

    model: str

    async def embed(self, texts: Sequence[str]) -> Vectors:
        ...

    async def close(self) -> None:
        ...


def unit(row: Vectors) -> Vectors:
    """One float32 row scaled to length 1 (a zero row stays zero); a value that is not finite
    counts as 0. A handful of numpy calls: a create embeds one sentence, where numpy's
    per-call overheads are most of the cost."""
    if not np.isfinite(row).all():
        row = np.nan_to_num(row, posinf=0.0, neginf=0.0)
    norm = np.sqrt(np.dot(row, row))
    scaled: Vectors = row / norm if norm > 0 else np.zeros_like(row)
    return scaled


def unit_rows(matrix: Any) -> Vectors:
    """Rows scaled to length 1 as float32, each by `unit`, so that a text's vector is the same
    to the bit whether it was embedded alone or in a batch."""
    rows = np.asarray(matrix, dtype=np.float32)
    if not len(rows):
        return rows.reshape(0, rows.shape[-1] if rows.ndim == 2 else 0)
    return np.stack([unit(row) for row in rows])


@functools.cache
def _wordllama() -> Any:
    """The bundled wordllama model: its default lookup misses the tokenizer in the wheel, so
    it is pointed at the installed package, with downloads off."""
    import wordllama  # type: ignore[import-untyped]

    folder = Path(wordllama.__file__).parent
    model = wordllama.WordLlama.load(cache_dir=folder, disable_download=True)
    prepare(model.tokenizer)
    return model


def embed_one(model: Any, text: str) -> Vectors:
    """One text's unit vector, as wordllama's `embed` pools it (its tokens' embeddings
    averaged; the same vector to the bit) without the per-batch work around it: a create embeds
    one sentence at a time (near duplicates), where that work was most of the cost. Its tokens
    come from `token_ids`: the tokenizer's ids, mostly from a table of words seen."""
    ids = token_ids(model.tokenizer, text)
    table = model.embedding
    if ids and max(ids) >= table.shape[0]:
        ids = [min(i, table.shape[0] - 1) for i in ids]
    pooled: Vectors = table[ids].sum(axis=0, dtype=np.float32) / np.float32(max(len(ids), 1))
    return unit(pooled)


class BuiltinEmbedder:
    """wordllama's 256-dimension static embeddings: microseconds per sentence, no service."""

    model = BUILTIN_MODEL

    def __init__(self) -> None:
        self._loaded: Any = None
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory, so that an embedding takes microseconds."""
        return self._loaded is not None

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if self._loaded is None:
            async with self._lock:
                if self._loaded is None:
                    try:  # the first use imports and loads it (about 0.3 s), off the loop
                        self._loaded = await asyncio.to_thread(_wordllama)
                    except Exception as exc:
                        raise EmbedderUnavailable(f"wordllama did not load: {exc}") from exc
        if len(texts) == 1:
            return embed_one(self._loaded, texts[0])[None, :]
        return unit_rows(self._loaded.embed(list(texts)))

    async def close(self) -> None:
        return None


class _Datum(msgspec.Struct):
    embedding: list[float]
    index: int = 0


class _Reply(msgspec.Struct):
    data: list[_Datum]


def embeddings_endpoint(url: str) -> str:
    """`MEMP_EMBEDDINGS_URL` as the endpoint: a base URL gets `/v1/embeddings` added."""
    url = url.rstrip("/")
    if url.endswith("/embeddings"):
        return url
    return f"{url}/embeddings" if url.endswith("/v1") else f"{url}/v1/embeddings"


class OpenAIEmbedder:
    """Any OpenAI-compatible `/v1/embeddings`; the key goes in `Authorization` only."""

    def __init__(self, url: str, model: str, api_key: str | None, timeout: float) -> None:
        self.model = f"openai:{model}"
        self._name = model
        self._endpoint = embeddings_endpoint(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        try:
            answer = await self._client.post(self._endpoint,
                                             json={"model": self._name, "input": list(texts)})
        except httpx.HTTPError as exc:
            raise EmbedderUnavailable(f"embeddings endpoint unreachable: {exc!r}") from None
        if answer.status_code != 200:
            raise EmbedderUnavailable(f"embeddings endpoint answered {answer.status_code}")
        try:
            data = sorted(msgspec.json.decode(answer.content, type=_Reply).data,
                          key=lambda d: d.index)
        except msgspec.MsgspecError as exc:
            raise EmbedderUnavailable(f"embeddings endpoint answered no embeddings: {exc}"
                                      ) from None
        dims = {len(d.embedding) for d in data}
        if len(data) != len(texts) or len(dims) != 1 or not 0 < dims.pop() <= MAX_DIMS:
            raise EmbedderUnavailable("embeddings endpoint answered vectors that do not fit "
                                      "the texts sent")
        return unit_rows([d.embedding for d in data])

    async def close(self) -> None:
        await self._client.aclose()


def open_embedder(settings: Settings) -> Embedder | None:
    """The embedder `MEMP_EMBEDDER` names; None for `none` (keyword search only)."""
    if settings.embedder == "none":
        return None
    if settings.embedder == "openai":
        return OpenAIEmbedder(settings.embeddings_url, settings.embeddings_model,
                              settings.embeddings_api_key, settings.embeddings_timeout_seconds)
    return BuiltinEmbedder()
