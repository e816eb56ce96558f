"""What a subscription asks beyond its patterns, read from request parameters once for every
way to subscribe (SSE, messages, MCP): a filter, conflation, a rate cap."""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.core.errors import MempError
from broker.core.filters import Filter, Guard, compile_guarded

CONFLATE_MODES = ("latest",)
MAX_RATE = 1000.0  # events per second a rate cap may ask for, at most


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """A compiled filter (None: every change) and its guard, conflation, and a rate cap
    (None: none)."""

    accepts: Filter | None = None
    guard: Guard | None = None
    conflate: bool = False
    max_rate: float | None = None


def _refuse(parameter: str, message: str, value: str) -> MempError:
    return MempError("invalid_request", f"{parameter}: {message}",
                     {"parameter": parameter, "value": value[:100]})


def parse_options(filter_text: str | None, conflate: str | None, max_rate: str | None
                  ) -> StreamOptions:
    """The options from their parameters' text; a bad one is `400 invalid_request` naming it."""
    accepts, guard = compile_guarded(filter_text) if filter_text else (None, None)
    if conflate not in (None, "", *CONFLATE_MODES):
        raise _refuse("conflate", f"unknown mode (known: {', '.join(CONFLATE_MODES)})", conflate)
    rate = None
    if max_rate not in (None, ""):
        try:
            rate = float(max_rate) if len(max_rate) <= 32 else math.nan
        except ValueError:
            rate = math.nan
        if not (0 < rate <= MAX_RATE):  # NaN fails too
            raise _refuse("max_rate", f"events per second, above 0 and at most {MAX_RATE:g}",
                          max_rate)
    return StreamOptions(accepts, guard, conflate == "latest", rate)
