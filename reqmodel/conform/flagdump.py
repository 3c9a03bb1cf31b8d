"""Dump a release's server flags and environment variables, read from the
release's own code: ``ServerArgs.add_cli_args`` on the parser that
``prepare_server_args`` builds, and the fields of ``sglang.srt.environ.Envs``.

Runs inside the conformance environment, one process per release::

    PYTHONPATH=<release tree>:<this folder> <env>/bin/python flagdump.py

reading ``{"argv": [[...], ...]}`` on stdin (argument lists to parse with the
real parser, or nothing), and prints one JSON object.  ``reqmodel audit`` reads the committed copy
(``reqmodel/audit/flags/<release>.json``, written by
``python tools/flag_dump.py --write``); the conformance suite regenerates it
from the wheel and fails if the committed copy differs.
"""
import argparse
import contextlib
import io
import json
import logging
import os
import sys
import warnings

# argparse's action classes, by what reqmodel's parser rebuilds
_ACTIONS = {
    "_StoreAction": "store", "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false", "_StoreConstAction": "store_const",
    "_AppendAction": "append", "_CountAction": "count", "BooleanOptionalAction": "boolean_optional",
}


def _plain(value):
    """``value`` when JSON can carry it, else None (the audit reads only
    plain defaults)."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        return None


def _action(a) -> dict:
    kind = _ACTIONS.get(type(a).__name__, "custom")  # the release's own Action class
    typ = getattr(a.type, "__name__", None) if a.type is not None else None
    return {
        "flags": list(a.option_strings), "dest": a.dest, "action": kind,
        "nargs": a.nargs if isinstance(a.nargs, (int, str)) else None,
        "type": typ if typ in ("int", "float", "str", "human_readable_int") else (
            None if typ is None else "other"),
        "default": _plain(a.default), "const": _plain(a.const),
        # a set's order changes with the hash seed: sorted, to compare dumps
        "choices": None if a.choices is None else [_plain(c) for c in (
            sorted(a.choices, key=str) if isinstance(a.choices, (set, frozenset, dict))
            else a.choices)],
    }


def _env(envs_cls) -> dict:
    out = {}
    for name, field in vars(envs_cls).items():
        if not name.startswith("SGLANG_") or not hasattr(field, "parse"):
            continue
        kind = type(field).__name__
        kind = ("bool" if "Bool" in kind else "int" if "Int" in kind
                else "float" if "Float" in kind else "str")
        out[name] = {"kind": kind, "default": _plain(getattr(field, "default", None))}
    return dict(sorted(out.items()))


def main() -> int:
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    with contextlib.redirect_stdout(io.StringIO()):
        import shims
        shims.install()
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.environ import Envs
    request = json.loads(sys.stdin.read() or "{}")
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    actions = [_action(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    answer = {"allow_abbrev": parser.allow_abbrev, "flags": actions, "env": _env(Envs)}
    # argument lists to parse with the real parser (prepare_server_args's
    # own parse_args), for the audit's parser to be compared with
    parsed = []
    for argv in request.get("argv", []):
        try:
            parsed.append({k: _plain(v) for k, v in vars(parser.parse_args(argv)).items()})
        except SystemExit:
            parsed.append({"error": True})
    answer["parsed"] = parsed
    json.dump(answer, sys.stdout, indent=0, sort_keys=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
