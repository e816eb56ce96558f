"""One text's token ids from the builtin model's tokenizer, for a create's embedding
(broker/amp/embedders.py), the same ids as the tokenizer's own call at a fraction of its cost.

The tokenizer shipped with wordllama (Llama 2's SentencePiece BPE) has no pre-tokenizer, no
truncation and a normalizer that only puts '▁' before the text and turns each space into '▁';
so a text holding none of its added tokens ('<s>' and the like) is tokenized by its BPE model
alone, on that normalized text, as one word. None of its merges joins a symbol ending in
another character to one starting with '▁', so the text splits before each '▁' that follows
another character into pieces (words, with the spaces before them) that the model tokenizes
independently: each piece's ids are kept in a bounded table, and a sentence costs a lookup per
word, the model being asked (once) only for the words it has not seen. Tokenizing a whole
sentence touched megabytes of merge tables each time: about 100 µs between creates, where
this takes about 40 µs with two words not seen before (bench/README.md).
Any other tokenizer (a wordllama release that changed it) is asked as a whole."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

_SPIECE = "\u2581"
_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": _SPIECE},
    {"type": "Replace", "pattern": {"String": " "}, "content": _SPIECE}]}
_PIECES = re.compile(f"{_SPIECE}*[^{_SPIECE}]+|{_SPIECE}+")
KEPT_PIECES = 20_000  # pieces whose ids are kept (the table starts over when full): a few MB
LONGEST_KEPT = 48  # characters: longer pieces are tokenized each time


@dataclass
class _Plan:
    """What the tokenizer takes as its own: its added tokens' texts; the ids of pieces seen."""

    added: tuple[str, ...]
    seen: dict[str, tuple[int, ...]] = field(default_factory=dict)


@functools.cache
def _plan(tokenizer: Any) -> _Plan | None:
    """A plan when `tokenizer` is of the shape described above; else None."""
    config = json.loads(tokenizer.to_str())
    padding, model = tokenizer.padding, config.get("model") or {}
    added = config.get("added_tokens") or []
    plain = config.get("pre_tokenizer") is None and config.get("normalizer") == _NORMALIZER \
        and tokenizer.truncation is None and (padding is None or padding["length"] is None) \
        and model.get("type") == "BPE" and not model.get("dropout") \
        and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix") \
        and not model.get("ignore_merges") and _never_unknown(model) \
        and all(not (t["normalized"] or t["lstrip"] or t["rstrip"] or t["single_word"])
                for t in added) \
        and not any(_joins_pieces(merge) for merge in model.get("merges") or [])
    return _Plan(tuple(t["content"] for t in added)) if plain else None


def _never_unknown(model: dict[str, Any]) -> bool:
    """Whether no character becomes the unknown token (whose runs the model fuses into one,
    across pieces): every byte has a token to fall back to."""
    vocab = model.get("vocab") or {}
    return not model.get("fuse_unk") or (bool(model.get("byte_fallback")) and all(
        f"<0x{byte:02X}>" in vocab for byte in range(256)))


def _joins_pieces(merge: str | list[str]) -> bool:
    """Whether a merge ("a b", or [a, b]) joins a symbol ending in a character other than '▁'
    to one starting with '▁'."""
    left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
    return right.startswith(_SPIECE) and not left.endswith(_SPIECE)


def prepare(tokenizer: Any) -> None:
    """Study the tokenizer (tens of milliseconds, once), before its first use."""
    _plan(tokenizer)


def token_ids(tokenizer: Any, text: str) -> list[int]:
    """`text`'s token ids without special tokens, as `tokenizer.encode` gives them."""
    plan = _plan(tokenizer)
    if plan is None or not text or any(token in text for token in plan.added):
        whole: list[int] = tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return whole
    seen = plan.seen
    pieces = _PIECES.findall(_SPIECE + text.replace(" ", _SPIECE))
    found = [seen.get(piece) for piece in pieces]
    new = [at for at, ids in enumerate(found) if ids is None]
    if new:
        for at, ids in zip(new, _tokenized(tokenizer, [pieces[at] for at in new]), strict=True):
            found[at] = ids
            piece = pieces[at]
            if len(piece) <= LONGEST_KEPT:
                if len(seen) >= KEPT_PIECES:
                    seen.clear()
                seen[piece] = ids
    return [token for ids in found if ids is not None for token in ids]


def _tokenized(tokenizer: Any, pieces: list[str]) -> list[tuple[int, ...]]:
    """Each piece's ids, from one call of the model over the pieces one after another (none
    of its tokens spans two of them): a token goes to the piece its first byte is in."""
    ends, end = [], 0
    for piece in pieces:
        end += len(piece.encode())
        ends.append(end)
    out: list[list[int]] = [[] for _ in pieces]
    at = 0
    for token in tokenizer.model.tokenize("".join(pieces)):
        while token.offsets[0] >= ends[at]:
            at += 1
        out[at].append(token.id)
    return [tuple(ids) for ids in out]
