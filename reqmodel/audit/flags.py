"""A release's server flags and environment variables, as its own code
defines them, and an operator's flags read with them.

The tables under ``flags/`` are dumped from each wheel's
``ServerArgs.add_cli_args`` and ``sglang.srt.environ.Envs`` by
``reqmodel/conform/flagdump.py`` (``python tools/flag_dump.py --write``);
the conformance suite regenerates them and fails on a difference.  The audit
rebuilds the release's argparse parser from its table, so a flag the release
does not know, a value its type refuses or a choice it does not list is
refused as the release's own ``sglang serve`` would refuse it.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

import attrs

from reqmodel import messages

HERE = pathlib.Path(__file__).parent / "flags"


class AuditError(ValueError):
    """Bad audit input; the message is one line for the user."""


def path(release: str) -> pathlib.Path:
    return HERE / f"{release}.json"


def encode(dump: dict) -> str:
    """The committed form of a dump: one flag and one variable per line, keys
    sorted, nulls left out (so a release's change reads as a small diff)."""
    lines = ['{"allow_abbrev": %s,' % json.dumps(dump["allow_abbrev"]), '"flags": [']
    flags = [json.dumps({k: v for k, v in sorted(f.items()) if v is not None})
             for f in dump["flags"]]
    lines.append(",\n".join(flags))
    lines.append('],\n"env": {')
    lines.append(",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                            for k, v in sorted(dump["env"].items())))
    lines.append("}}")
    return "\n".join(lines) + "\n"


@attrs.frozen
class Table:
    release: str
    allow_abbrev: bool
    flags: Tuple[dict, ...]
    env: Dict[str, dict]

    def dest(self, flag: str) -> Optional[str]:
        return next((f["dest"] for f in self.flags if flag in f["flags"]), None)


# variables the transfer engine reads, not SGLang: a deployment sets them in
# the same environment, and the model orders timeouts by them (model.clocks)
ENGINE_ENV = {"MC_TRANSFER_TIMEOUT": {"default": 30, "kind": "int"}}


@lru_cache(maxsize=None)
def load(release: str) -> Table:
    data = json.loads(path(release).read_text())
    return Table(release, data["allow_abbrev"], tuple(data["flags"]),
                 {**data["env"], **ENGINE_ENV})


def human_readable_int(value: str) -> int:
    """SGLang's own reading of ``--context-length 128k`` and the like
    (``human_readable_int``, utils/common.py 19:3111-3146): SI suffixes with
    decimals, IEC suffixes without."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"decimals are not allowed with IEC suffixes like '{suffix}'")
            return int(number) * iec[suffix]
        result = Decimal(number) * si[suffix]
        if result != result.to_integral_value():
            raise argparse.ArgumentTypeError(f"'{value}' is not a whole number of tokens")
        return int(result)
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: '{value}'") from None


_TYPES = {"int": int, "float": float, "str": str, "human_readable_int": human_readable_int}


class _Parser(argparse.ArgumentParser):
    """argparse, refusing in one line instead of printing usage and exiting."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise AuditError(message)


def _add(parser: argparse.ArgumentParser, f: dict) -> None:
    kind = f["action"]
    kw: Dict[str, Any] = {"dest": f["dest"], "default": f.get("default")}
    names = list(f["flags"])
    if kind == "store_true":
        kw["action"] = "store_true"
    elif kind == "store_false":
        kw["action"] = "store_false"
    elif kind == "store_const" or (kind == "custom" and f.get("nargs") == 0):
        # a release's own Action class taking no value (deprecated aliases,
        # warnings) reads as a switch: it is known, and the audit reads none
        kw.update(action="store_const", const=f.get("const"))
    elif kind == "count":
        kw["action"] = "count"
    elif kind == "boolean_optional":
        kw["action"] = argparse.BooleanOptionalAction
        names = [n for n in names if not n.startswith("--no-")] or names[:1]
    else:
        kw["action"] = "append" if kind == "append" else "store"
        if f.get("nargs") is not None:
            kw["nargs"] = f["nargs"]
        if f.get("type") in _TYPES:
            kw["type"] = _TYPES[f["type"]]
            if f.get("choices") is not None:
                kw["choices"] = f["choices"]
    parser.add_argument(*names, **kw)


@lru_cache(maxsize=None)
def parser(release: str) -> argparse.ArgumentParser:
    table = load(release)
    p = _Parser(prog=f"sglang {release} serve", allow_abbrev=table.allow_abbrev,
                add_help=False)
    for f in table.flags:
        _add(p, f)
    return p


def parse(release: str, role: str, text: str) -> Dict[str, Any]:
    """The operator's flags for one role, read with ``release``'s own
    definitions: every destination with its value or the release's default."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise AuditError(f"--{role}-args: cannot split {text!r}: {exc}") from None
    if "--config" in argv:
        raise AuditError(f"--{role}-args: --config files are not read; pass the flags "
                         "themselves (sglang merges the file into the same flags)")
    try:
        ns = parser(release).parse_args(argv)
    except AuditError as exc:
        msg = str(exc).replace("unrecognized arguments", "not a server flag of "
                               f"sglang {release}")
        known = [f for spec in load(release).flags for f in spec["flags"]]
        unknown = [a.split("=", 1)[0] for a in argv
                   if a.startswith("--") and a.split("=", 1)[0] not in known]
        hint = messages.did_you_mean(unknown[0], known) if unknown else ""
        raise AuditError(f"--{role}-args: {msg}{hint}") from None
    return vars(ns)


@attrs.frozen
class EnvSetting:
    role: str  # "prefill", "decode" or "both"
    name: str
    value: Any


def parse_env(release: str, items: List[str]) -> List[EnvSetting]:
    """``--env NAME=VALUE`` (both roles) or ``--env prefill:NAME=VALUE``: each
    variable the release reads (``Envs``), parsed as the release parses it."""
    table = load(release)
    out: List[EnvSetting] = []
    for item in items:
        role, _, rest = item.partition(":") if item.split("=", 1)[0].count(":") else (
            "both", "", item)
        if role not in ("prefill", "decode", "both"):
            raise AuditError(f"--env {item!r}: the role before ':' must be prefill or decode")
        name, eq, raw = rest.partition("=")
        if not eq or not name:
            raise AuditError(f"--env {item!r}: expected NAME=VALUE or ROLE:NAME=VALUE")
        spec = table.env.get(name)
        if spec is None:
            raise AuditError(f"--env {name}: not an environment variable sglang {release} reads "
                             "(sglang.srt.environ.Envs) nor one of the transfer engine's the "
                             f"model knows ({', '.join(ENGINE_ENV)})")
        out.append(EnvSetting(role, name, _env_value(name, spec["kind"], raw)))
    seen = set()
    for s in out:
        for r in (("prefill", "decode") if s.role == "both" else (s.role,)):
            if (r, s.name) in seen:
                raise AuditError(f"--env {s.name} is given twice for {r}")
            seen.add((r, s.name))
    return out


def _env_value(name: str, kind: str, raw: str) -> Any:
    """The release's EnvBool / EnvInt / EnvFloat parsing (environ.py
    19:143-200)."""
    text = raw.strip()
    if kind == "bool":
        if text.lower() in ("true", "1", "yes", "y"):
            return True
        if text.lower() in ("false", "0", "no", "n"):
            return False
        raise AuditError(f"--env {name}={raw}: not a boolean (true/false/1/0/yes/no)")
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(Decimal(text))
    except (ValueError, InvalidOperation):
        raise AuditError(f"--env {name}={raw}: not a{'n integer' if kind == 'int' else ' number'}")
    return raw


def env_for(release: str, settings: List[EnvSetting], role: str) -> Dict[str, Any]:
    """Each variable's value on ``role``: the operator's, else the release's default."""
    values = {k: v["default"] for k, v in load(release).env.items()}
    for s in settings:
        if s.role in (role, "both"):
            values[s.name] = s.value
    return values
