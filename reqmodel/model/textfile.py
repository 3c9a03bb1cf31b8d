"""Reading a user's file before any parser sees it: bytes, a size limit,
UTF-8 decoded explicitly, and the nesting depth and number lengths that make
Python's TOML and JSON parsers raise ``RecursionError`` or ``ValueError``
checked first.  Each refusal is one line naming the file (the caller's error
class carries it)."""
from __future__ import annotations

from typing import Type

from reqmodel import output

MAX_BYTES = 4 * 1024 * 1024  # the largest corpus trace is ~0.4 MB
MAX_DEPTH = 64  # brackets and braces; a scenario needs 2, a trace about 8
MAX_DIGITS = 40  # a number's digits; the model's largest values have 3


def read(path: str, what: str, error: Type[Exception], fmt: str) -> str:
    """The text of ``path`` (``fmt`` is ``"toml"``, ``"json"`` or ``"python"``), or
    ``error`` with one line: missing, unreadable, too large, not UTF-8,
    nested too deeply, a number too long."""
    staged = output.pending(path)
    try:
        if staged is not None:
            data = staged.encode("utf-8")
        else:
            with open(path, "rb") as fh:
                data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what} file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not a {what} file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = " (UTF-16?)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise error(f"{path}: not UTF-8 text{hint}: byte 0x{data[exc.start]:02x} at offset "
                    f"{exc.start}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if fmt != "python":  # Python's compiler has its own nesting limit (a SyntaxError)
        _shape(text, path, error, fmt)
    return text


def _shape(text: str, path: str, error: Type[Exception], fmt: str) -> None:
    """Bracket depth and digit runs outside strings (and TOML comments)."""
    depth = digits = i = 0
    line = 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        if c == '"' or (c == "'" and fmt == "toml"):
            triple = fmt == "toml" and text.startswith(c * 3, i)
            close = c * 3 if triple else c
            i += len(close)
            while i < n and not text.startswith(close, i):
                if text[i] == "\\" and c == '"':
                    i += 1
                elif text[i] == "\n":
                    line += 1
                i += 1
            i += len(close)
            digits = 0
            continue
        if c == "#" and fmt == "toml":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise error(f"{path}: line {line}: nested more than {MAX_DEPTH} deep")
        elif c in "]}":
            depth = max(0, depth - 1)
        if c.isdigit():
            digits += 1
            if digits > MAX_DIGITS:
                raise error(f"{path}: line {line}: a number of more than {MAX_DIGITS} digits")
        else:
            digits = 0
        i += 1
