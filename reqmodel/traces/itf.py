"""Counterexample traces in the Informal Trace Format (ITF, Apalache ADR-015).

A trace file is a JSON object with ``#meta`` (format, source, release,
scenario and its full configuration, property, engine; no timestamp, so that
the committed corpus is the same file whenever it is regenerated), ``vars``
and ``states``.  Integers are ``{"#bigint": "..."}``, tuples ``#tup``, maps
``#map``; records are plain objects; an optional value is a set of at most
one element (``{"#set": []}`` when absent, ``{"#set": [v]}`` when present),
the TLA+ idiom that every ITF reader handles (variants with tuple payloads
trip some readers, itf-py 0.5 among them).  Each state's ``#meta`` holds its
index, the action taken to reach it and the action's parameters (request and
choice), which is all ``read_steps`` needs to replay it.
"""
from __future__ import annotations

import enum
import json
from typing import Any, Dict, List, Tuple

import attrs

from reqmodel import output
from reqmodel.model import textfile
from reqmodel.model.actions import BY_NAME, Step
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import State

FORMAT = "ITF"
FORMAT_DESCRIPTION = "https://apalache-mc.org/docs/adr/015adr-trace.html"
# every field of the state, in declaration order: a trace records all of
# it, but a field marked ITF_OMIT only where it moves (``trace_vars``)
VARS = tuple(f.name for f in attrs.fields(State))


class TraceFileError(ValueError):
    """A trace file that cannot be read; the message is one line for the user."""


ABSENT = {"#set": []}


def big(n: int) -> Dict[str, str]:
    return {"#bigint": str(int(n))}


def encode(value: Any) -> Any:
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int):
        return big(value)
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return {"#tup": [encode(v) for v in value]}
    if attrs.has(type(value)):
        return {f.name: _opt(getattr(value, f.name), f) for f in attrs.fields(type(value))
                if not (f.metadata.get("itf_omit_default") and getattr(value, f.name) == f.default)}
    raise TypeError(f"cannot encode {type(value).__name__} in ITF")


def _opt(v: Any, field) -> Any:
    """Fields typed Optional[...] are variants; others encode directly."""
    if "Optional" in str(field.type):
        return ABSENT if v is None else {"#set": [encode(v)]}
    return encode(v)


def encode_step(step: Step) -> Dict[str, Any]:
    """``{"rid": r, <choice name>: value, ...}`` with the action's choice names."""
    out: Dict[str, Any] = {"rid": big(step.rid)}
    for name, value in zip(BY_NAME[step.action].arg_names, step.arg):
        out[name] = encode(_plain(value))
    return out


def _plain(x):
    if isinstance(x, (list, tuple)):
        return tuple(_plain(v) for v in x)
    return x


def decode_plain(value: Any) -> Any:
    """Decode the ITF values used in step parameters (ints, tuples, lists)."""
    if isinstance(value, dict):
        if "#bigint" in value:
            return int(value["#bigint"])
        if "#tup" in value:
            return tuple(decode_plain(v) for v in value["#tup"])
        raise TraceFileError(f"unsupported ITF value in action parameters: {sorted(value)}")
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        return tuple(decode_plain(v) for v in value)
    raise TraceFileError(f"unsupported ITF value in action parameters: {value!r}")


def trace_vars(states) -> Tuple[str, ...]:
    """The state variables a trace file lists: every field of ``State``, but
    one marked ``ITF_OMIT`` only when some state of the trace moves it off its
    default (a prefill instance's death is in no other trace's file)."""
    return tuple(f.name for f in attrs.fields(State)
                 if not f.metadata.get("itf_omit_default")
                 or any(getattr(s, f.name) != f.default for s in states))


def to_itf(trace, scenario: Scenario, engine: str = "exhaustive",
           extra_meta: Dict[str, Any] = None) -> Dict[str, Any]:
    states: List[Dict[str, Any]] = []
    names = trace_vars(trace.states)
    for i, s in enumerate(trace.states):
        meta: Dict[str, Any] = {"index": i}
        if i == 0:
            meta["action"] = "init"
            meta["params"] = {}
        else:
            step = trace.steps[i - 1]
            meta["action"] = step.action
            meta["actor"] = BY_NAME[step.action].actor
            meta["params"] = encode_step(step)
        if i == len(trace.states) - 1 and trace.violation != "reached":
            meta["violation"] = trace.property
        if trace.loop is not None and i == trace.loop:
            meta["loop"] = "the cycle starts here; the last state equals this one"
        st = {"#meta": meta}
        for v in names:
            st[v] = encode(getattr(s, v))
        states.append(st)
    live: Dict[str, Any] = {}
    if trace.rid is not None:
        live["request"] = trace.rid
    if trace.violation == "stuck":
        live["ends_by"] = [{"action": a, "request": r, "env": env, "seconds": sec}
                           for a, r, env, sec in trace.ends_by]
        if trace.rid is not None and not trace.ends_by:
            # where the request waits for good: its stage on each worker
            last = trace.states[-1]
            live["waits_at"] = {"prefill": last.p[trace.rid].stage.name,
                                "decode": last.d[trace.rid].stage.name}
    out = {
        "#meta": {
            "format": FORMAT,
            "format-description": FORMAT_DESCRIPTION,
            "source": "reqmodel",
            "release": trace.release,
            "scenario": trace.scenario,
            "scenario_config": scenario.to_dict(),
            "property": trace.property,
            "kind": "witness" if trace.violation == "reached" else "counterexample",
            "violation": trace.violation,
            "engine": engine,
            **live,
            **(extra_meta or {}),
        },
        "vars": list(names),
        "states": states,
    }
    if trace.loop is not None:
        # ITF's lasso: the last state loops back to states[loop] (here it
        # equals it, so the closing step is in the trace and replays)
        out["loop"] = trace.loop
    return out


def write(path, trace, scenario: Scenario, engine: str = "exhaustive",
          extra_meta: Dict[str, Any] = None) -> None:
    data = to_itf(trace, scenario, engine, extra_meta)
    output.write_text(path, json.dumps(data, indent=1) + "\n")


def read(path) -> Tuple[Dict[str, Any], Tuple[Step, ...]]:
    """Read a trace file: its top-level ``#meta`` and the recorded steps."""
    text = textfile.read(path, "trace", TraceFileError, "json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFileError(f"{path}: invalid JSON: {exc.msg} at line {exc.lineno}") from None
    except (RecursionError, ValueError) as exc:  # beyond what textfile checks
        raise TraceFileError(f"{path}: cannot parse: {str(exc).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise TraceFileError(f"{path}: not an ITF trace (top level is not an object)")
    from reqmodel.traces import schema
    schema.check(data, str(path), TraceFileError)
    for key in ("vars", "states"):
        if key not in data:
            raise TraceFileError(f"{path}: not an ITF trace (missing {key!r})")
    if not isinstance(data["states"], list) or not data["states"]:
        raise TraceFileError(f"{path}: 'states' must be a non-empty list")
    meta = data.get("#meta", {})
    if not isinstance(meta, dict):
        raise TraceFileError(f"{path}: '#meta' must be an object")
    if "loop" in data:
        loop = data["loop"]
        if (not isinstance(loop, int) or isinstance(loop, bool)
                or not 0 <= loop < len(data["states"]) - 1):
            raise TraceFileError(f"{path}: 'loop' must be the index of a state before the last")
        meta = {**meta, "loop": loop}
    steps = []
    for i, st in enumerate(data["states"][1:], start=1):
        m = st.get("#meta") if isinstance(st, dict) else None
        if not isinstance(m, dict) or "action" not in m:
            if meta.get("source") != "reqmodel":  # another tool's ITF: no actions to replay
                raise TraceFileError(
                    f"{path}: not a reqmodel trace (its '#meta' has no \"source\": "
                    "\"reqmodel\", and its states name no actions to replay)")
            raise TraceFileError(f"{path}: state {i} has no '#meta' action")
        name = m["action"]
        if name not in BY_NAME:
            raise TraceFileError(f"{path}: state {i}: unknown action {name!r}")
        params = m.get("params", {})
        if not isinstance(params, dict) or "rid" not in params:
            raise TraceFileError(f"{path}: state {i}: action {name} has no 'rid' parameter")
        action = BY_NAME[name]
        names = action.arg_names
        while (len(names) > len(action.arg_names) - action.optional_args
               and names[-1] not in params):
            names = names[:-1]  # e.g. a one-rank scenario's steps name no decode rank
        unknown = set(params) - {"rid", *names}
        if unknown:
            raise TraceFileError(f"{path}: state {i}: action {name}: unknown parameter "
                                 f"{sorted(unknown)[0]!r}")
        missing = [n for n in names if n not in params]
        if missing:
            raise TraceFileError(f"{path}: state {i}: action {name}: missing parameter {missing[0]!r}")
        rid = decode_plain(params["rid"])
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise TraceFileError(f"{path}: state {i}: 'rid' must be an integer")
        steps.append(Step(name, rid, tuple(decode_plain(params[n]) for n in names)))
    return meta, tuple(steps)
