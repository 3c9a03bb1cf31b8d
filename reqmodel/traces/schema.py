"""The shape of an ITF trace file as reqmodel reads it, as a JSON Schema
(draft 2020-12, checked with ``jsonschema``): every field ``itf.read`` and
``replay.load`` use, with its type, so that a wrong value anywhere is one
line naming the key path and what was expected, before anything reads it.
The states' variables are not checked: replay recomputes them from the
steps."""
from __future__ import annotations

from typing import Any, Type

import jsonschema

from reqmodel import messages

_TEXT = {"type": "string", "maxLength": 200}
_BIGINT = {"type": "object", "required": ["#bigint"], "additionalProperties": False,
           "properties": {"#bigint": {"type": "string", "pattern": r"^-?[0-9]{1,40}$"}}}
_INT = {"anyOf": [{"type": "integer"}, _BIGINT]}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        # a step parameter: an integer, a tuple or list of parameters, a string or a bool
        "param": {"anyOf": [
            _INT, {"type": "boolean"}, _TEXT,
            {"type": "object", "required": ["#tup"], "additionalProperties": False,
             "properties": {"#tup": {"type": "array", "maxItems": 64,
                                     "items": {"$ref": "#/$defs/param"}}}},
            {"type": "array", "maxItems": 64, "items": {"$ref": "#/$defs/param"}},
        ]},
    },
    "type": "object",
    "required": ["vars", "states"],
    "properties": {
        "#meta": {"type": "object", "properties": {
            "format": _TEXT, "format-description": _TEXT, "source": _TEXT,
            "release": _TEXT, "scenario": _TEXT, "property": _TEXT, "kind": _TEXT,
            "violation": _TEXT, "engine": _TEXT, "guards": _TEXT, "base": _TEXT,
            "scenario_config": {"type": "object"},
            "request": {"type": "integer", "minimum": 0},
            "depth": {"type": "integer", "minimum": 0},
            "loop": {"type": "integer", "minimum": 0},
        }},
        "vars": {"type": "array", "items": _TEXT},
        "loop": {"type": "integer", "minimum": 0},
        "states": {"type": "array", "minItems": 1, "maxItems": 10_000, "items": {
            "type": "object", "properties": {
                "#meta": {"type": "object", "required": ["action"], "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "action": _TEXT, "actor": _TEXT,
                    "params": {"type": "object", "properties": {"rid": _INT},
                               "additionalProperties": {"$ref": "#/$defs/param"}},
                }},
            }}},
    },
}

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _where(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the top level"


def _short(value: Any, limit: int = 60) -> str:
    """The value as JSON (``null``, not ``None``), cut to ``limit``."""
    return messages.short(value, limit, as_json=True)


def check(data: Any, path: str, error: Type[Exception]) -> None:
    """``error`` with one line when ``data`` does not have the schema's shape."""
    err = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(data))
    if err is None:
        return
    # a value that matches none of several shapes: say which value, not
    # every alternative
    what = err.validator
    if what in ("anyOf", "oneOf"):
        msg = f"{_short(err.instance)} is not a valid value here"
    elif what == "type":
        msg = f"expected {err.validator_value}, got {_short(err.instance)}"
    elif what == "required":
        msg = "missing " + err.message.split(" is a required")[0]
    elif what == "pattern":
        msg = f"{_short(err.instance)} is not a decimal integer"
    else:
        msg = err.message if len(err.message) <= 120 else err.message[:117] + "..."
    raise error(f"{path}: at {_where(err.absolute_path)}: {msg}")
