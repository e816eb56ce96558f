"""The builtin embedder embeds one text (a create's near duplicates) by a shorter path than
wordllama's batch `embed`: the vector must be the same to the bit, or one cell would be ranked
by two slightly different vectors depending on which path embedded it."""

from __future__ import annotations

import asyncio

import numpy as np

from broker.amp.embedders import BuiltinEmbedder, _wordllama, unit_rows

TEXTS = ["Ana is allergic to peanuts and carries an epinephrine pen",
         "what food could hurt Ana?", "eu-central-1", "", "   ", "é ü 中文 😀 \u0000",
         "word " * 3000]


def test_one_text_is_embedded_as_in_a_batch() -> None:
    embedder = BuiltinEmbedder()
    batch = asyncio.run(embedder.embed(TEXTS))
    assert np.array_equal(batch, unit_rows(_wordllama().embed(TEXTS)))
    for text, row in zip(TEXTS, batch, strict=True):
        assert np.array_equal(asyncio.run(embedder.embed([text]))[0], row), text[:20]
