"""One text's token ids from the builtin model's tokenizer, for a create's embedding
(broker/amp/embedders.py). The tokenizer shipped with wordllama has no pre-tokenizer, no
truncation and a normalizer that only puts '▁' before the text and turns each space into
'▁'; a text holding none of its added tokens ('<s>' and the like) is then tokenized by its BPE
model alone on that normalized text. Asking the model directly gives the same ids as the
tokenizer's own call (checked against it over thousands of texts, tests/amp/test_embedders.py)
at about a third of its cost: it skips the added-token scan, the normalizer's per-character
alignments and the encoding's offsets, strings and masks. Any other tokenizer (a wordllama
release that changed it) takes the tokenizer's own call."""

from __future__ import annotations

import functools
import json
from typing import Any

_SPIECE = "\u2581"
_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": _SPIECE},
    {"type": "Replace", "pattern": {"String": " "}, "content": _SPIECE}]}


@functools.cache
def _added_tokens(tokenizer: Any) -> tuple[str, ...] | None:
    """The added tokens' texts when `tokenizer` is of the shape described above; else None."""
    config = json.loads(tokenizer.to_str())
    padding = tokenizer.padding
    added = config.get("added_tokens") or []
    plain = config.get("pre_tokenizer") is None and config.get("normalizer") == _NORMALIZER \
        and tokenizer.truncation is None and (padding is None or padding["length"] is None) \
        and all(not (t["normalized"] or t["lstrip"] or t["rstrip"] or t["single_word"])
                for t in added)
    return tuple(t["content"] for t in added) if plain else None


def token_ids(tokenizer: Any, text: str) -> list[int]:
    """`text`'s token ids without special tokens, as `tokenizer.encode` gives them."""
    added = _added_tokens(tokenizer)
    if added is None or not text or any(token in text for token in added):
        ids: list[int] = tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return ids
    return [token.id for token in tokenizer.model.tokenize(_SPIECE + text.replace(" ", _SPIECE))]
