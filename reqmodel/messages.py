"""A user's value in a one-line message: every edge (scenario files, trace
files, proposals, names on the command line) shows what it refuses the same
way, on one line and cut short."""
from __future__ import annotations

import difflib
import json
from typing import Any, Iterable

WIDTH = 60  # characters of a value shown in a message


def short(value: Any, limit: int = WIDTH, as_json: bool = False) -> str:
    """``value`` as Python's repr (or JSON: ``null``, not ``None``), on one
    line, cut to ``limit`` characters; never raises (a user object's repr
    may)."""
    try:
        text = json.dumps(value) if as_json else repr(value)
    except BaseException:  # noqa: BLE001 (a user object's __repr__, or not JSON)
        try:
            text = repr(value)
        except BaseException:  # noqa: BLE001
            text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def did_you_mean(name: Any, known: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the closest known names, or nothing."""
    close = difflib.get_close_matches(str(name)[:80], list(known), n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
