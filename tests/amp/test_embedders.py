"""The builtin embedder embeds one text (a create's near duplicates) by a shorter path than
wordllama's batch `embed`: the vector must be the same to the bit, or one cell would be ranked
by two slightly different vectors depending on which path embedded it."""

from __future__ import annotations

import asyncio
import random

import numpy as np

from broker.amp.embedders import BuiltinEmbedder, _wordllama, unit_rows
from broker.amp.token_ids import token_ids

TEXTS = ["Ana is allergic to peanuts and carries an epinephrine pen",
         "what food could hurt Ana?", "eu-central-1", "", "   ", "é ü 中文 😀 \u0000",
         "word " * 3000]


def test_one_text_is_embedded_as_in_a_batch() -> None:
    embedder = BuiltinEmbedder()
    batch = asyncio.run(embedder.embed(TEXTS))
    assert np.array_equal(batch, unit_rows(_wordllama().embed(TEXTS)))
    for text, row in zip(TEXTS, batch, strict=True):
        assert np.array_equal(asyncio.run(embedder.embed([text]))[0], row), text[:20]


def test_token_ids_are_the_tokenizers_own() -> None:
    """Words' ids kept from earlier texts or asked of the model, or the tokenizer's call where
    the text holds an added token or is empty: the same ids for texts of words, spaces in runs,
    other whitespace, '▁' itself, accents, scripts and emoji (byte fallback)."""
    tokenizer = _wordllama().tokenizer
    rng = random.Random(28)
    pieces = ["Ana", "cat", "the", "invoice", "2016", "naïve", "東京", "😀", "don't", "<s>",
              "</s>", "<unk>", "\u2581", "\t", "\n", "\u00a0", "\u200b", ".", ""]
    texts = [*TEXTS, "<s>", "a<s>b", " leading", "trailing ", "x  y", "\u2581"]
    texts += ["".join(rng.choice(pieces) + rng.choice(["", " ", "  "])
                      for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    for text in texts:
        assert token_ids(tokenizer, text) == \
            tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids, text[:40]
