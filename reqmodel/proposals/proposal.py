"""Guard proposals: a Python file that names a base release and replaces
guard points (and, where a fix needs it, cleanups or options).

A proposal file looks like this::
    from reqmodel.proposals import is_unadmitted_reject, RETIRE_CLEANUP_FULL
    from reqmodel.proposals.proposal import is_unadmitted_reject, RETIRE_CLEANUP_FULL

    base = "0.5.20"
    retire_cleanup = RETIRE_CLEANUP_FULL     # optional: what a door retire runs

    def prefill_door(req):                   # a guard point, by name
        return is_unadmitted_reject(req)

Every public callable defined in the file must be a guard point (helpers start
with ``_``). Optional data: ``retire_cleanup`` (steps of the door retire),
``checksum`` (``"prompt"`` or ``"suffix"``: the KV checksum code the release
has), and ``scenario_overrides`` (TOML-shaped tables forced onto every
scenario, e.g. ``{"prefill": {"kv_checksum": True}, "decode": {"kv_checksum":
True}}``).

A replaced guard point is wrapped: a wrong return type, or an exception raised
inside it, stops the check with a one-line :class:`ProposalError` naming the
file and the guard point.
"""
from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys
from typing import Any, Callable, Dict, Optional

import attrs

from reqmodel.model import guards as g
from reqmodel.model import releases
from reqmodel.model.behaviours import CHECKSUMS
from reqmodel.model import scenario as sc_mod
from reqmodel.model.guards import (DROP, REQUEUE, RETIRE, SEND, finished, is_aborted,  # noqa: F401 (API)
                     is_unadmitted_reject)
from reqmodel.model.releases import RETIRE_CLEANUP_FULL  # noqa: F401 (API)
from reqmodel.model.state import ABORT_400, ABORT_500, LENGTH, Finish  # noqa: F401 (API)

FINISH_LENGTH = LENGTH


def FINISH_ABORT(status: int = 500) -> Finish:  # noqa: N802 (SGLang's name)
    return Finish("abort", status)


class ProposalError(ValueError):
    """A proposal that cannot be used; one line naming the file and the problem."""


DATA_FIELDS = {"base", "retire_cleanup", "checksum", "scenario_overrides", "description"}
RETIRE_STEPS = set(RETIRE_CLEANUP_FULL)


@attrs.frozen
class Proposal:
    path: str
    name: str
    release: releases.Release
    base: releases.Release
    replaced: tuple
    scenario_overrides: Dict[str, Any]
    description: str

    def apply(self, sc: sc_mod.Scenario) -> sc_mod.Scenario:
        """The scenario with the proposal's forced options."""
        if not self.scenario_overrides:
            return sc
        data = sc.to_dict()
        for table, values in self.scenario_overrides.items():
            if table not in ("prefill", "decode", "options", "events"):
                raise ProposalError(f"{self.path}: scenario_overrides: unknown table {table!r}")
            if not isinstance(values, dict):
                raise ProposalError(f"{self.path}: scenario_overrides[{table!r}] must be a dict")
            data[table] = {**data[table], **values}
        try:
            return sc_mod.from_dict(data)
        except sc_mod.ScenarioError as exc:
            raise ProposalError(f"{self.path}: scenario_overrides: {exc}") from None


def _wrap(path: str, gp: g.GuardPoint, fn: Callable) -> Callable:
    def guarded(*args):
        try:
            out = fn(*args)
        except Exception as exc:  # a bug in the proposal, reported in one line
            raise ProposalError(f"{path}: {gp.name} raised {type(exc).__name__}: {exc}") from None
        if not gp.valid(out):
            raise ProposalError(f"{path}: {gp.name} returned {out!r} ({type(out).__name__}); "
                                f"it must return {gp.returns}")
        return out
    guarded.__name__ = fn.__name__
    guarded.__doc__ = fn.__doc__ or f"{gp.name} from {path}"
    guarded.__wrapped__ = fn
    return guarded


def load(path: str) -> Proposal:
    p = pathlib.Path(path)
    if not p.is_file():
        raise ProposalError(f"{path}: no such proposal file")
    spec = importlib.util.spec_from_file_location(f"reqmodel_proposal_{p.stem.replace('-', '_')}", p)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise ProposalError(f"{path}: does not import: SyntaxError: {exc.msg} (line {exc.lineno})") from None
    except Exception as exc:
        raise ProposalError(f"{path}: does not import: {type(exc).__name__}: {exc}") from None
    base_name = getattr(module, "base", None)
    if base_name is None:
        raise ProposalError(f"{path}: names no base release (add base = \"0.5.20\", say)")
    try:
        base = releases.get(base_name)
    except releases.ReleaseError as exc:
        raise ProposalError(f"{path}: base: {exc}") from None
    changes: Dict[str, Any] = {}
    replaced = []
    for name, value in vars(module).items():
        if name.startswith("_") or not callable(value) or inspect.isclass(value):
            continue
        if getattr(value, "__module__", None) != module.__name__:
            continue  # imported helpers
        gp = g.GUARD_POINTS.get(name)
        if gp is None:
            raise ProposalError(
                f"{path}: {name} is not a guard point (known: {', '.join(g.GUARD_POINTS)}); "
                "name helpers with a leading underscore")
        try:
            params = list(inspect.signature(value).parameters.values())
        except (TypeError, ValueError):
            params = None
        if params is not None and (len(params) != len(gp.args) or any(
                q.kind in (q.VAR_POSITIONAL, q.VAR_KEYWORD, q.KEYWORD_ONLY) for q in params)):
            got = ", ".join(q.name for q in params)
            raise ProposalError(f"{path}: {name}({got}) has the wrong signature; "
                                f"it must be {name}({', '.join(gp.args)})")
        changes[name] = _wrap(path, gp, value)
        replaced.append(name)
    cleanup = getattr(module, "retire_cleanup", None)
    if cleanup is not None:
        if (not isinstance(cleanup, (tuple, list))
                or not all(isinstance(x, str) and x in RETIRE_STEPS for x in cleanup)):
            raise ProposalError(f"{path}: retire_cleanup must be a tuple of steps from "
                                f"{sorted(RETIRE_STEPS)}")
        changes["retire_cleanup"] = tuple(cleanup)
        replaced.append("retire_cleanup")
    checksum = getattr(module, "checksum", None)
    if checksum is not None:
        if checksum not in ("prompt", "suffix"):
            raise ProposalError(f"{path}: checksum must be \"prompt\" or \"suffix\"")
        changes["checksum"] = CHECKSUMS[checksum]
        replaced.append("checksum")
    overrides = getattr(module, "scenario_overrides", {}) or {}
    if not isinstance(overrides, dict):
        raise ProposalError(f"{path}: scenario_overrides must be a dict of tables")
    if not replaced and not overrides:
        raise ProposalError(f"{path}: replaces no guard point and sets no option")
    name = p.stem
    release = attrs.evolve(base, name=f"{base.name}+{name}", **changes)
    prop = Proposal(path=str(path), name=name, release=release, base=base,
                    replaced=tuple(replaced), scenario_overrides=overrides,
                    description=str(getattr(module, "description", "") or (module.__doc__ or "")).strip())
    # validate overrides now, on the default scenario, before anything runs
    prop.apply(sc_mod.builtin(sc_mod.DEFAULT))
    return prop
