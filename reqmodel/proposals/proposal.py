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

A proposal is trusted user code, run in this process (``reqmodel.usercode``):
whatever it raises at import or in a guard (``SystemExit`` included) and a
call that runs past the time limit stop the command with a one-line
:class:`ProposalError` naming the file and the guard point. A guard that can
return anything but what its point returns, on any path, is refused when the
file is loaded, before anything runs (:func:`_check_returns`, by the
symbolic execution of ``engines.z3.guard_diff``); a wrapper still checks
every concrete return.
"""
from __future__ import annotations

import inspect
import pathlib
import tomllib
import types
from typing import Any, Callable, Dict

import attrs

from reqmodel.model import guards as g
from reqmodel.model import releases
from reqmodel.model.behaviours import CHECKSUMS
from reqmodel.model import scenario as sc_mod
from reqmodel.model import textfile
from reqmodel.model.guards import (DROP, REQUEUE, RETIRE, SEND, finished, is_aborted,  # noqa: F401 (API)
                     is_unadmitted_reject)
from reqmodel.model.releases import RETIRE_CLEANUP_FULL  # noqa: F401 (API)
from reqmodel.model.state import ABORT_400, ABORT_500, LENGTH, Finish  # noqa: F401 (API)
from reqmodel import messages, usercode

FINISH_LENGTH = LENGTH


def FINISH_ABORT(status: int = 500) -> Finish:  # noqa: N802 (SGLang's name)
    return Finish("abort", status)


class ProposalError(usercode.UserCodeError):
    """A proposal that cannot be used; one line naming the file and the problem."""


RETIRE_STEPS = set(RETIRE_CLEANUP_FULL)
# the data a proposal file may set: name -> (type, meaning); 'reqmodel guard
# points' lists them, and load() checks each one's type
FIELDS = {
    "base": ("str (required)", 'the release the proposal changes, e.g. "0.5.20"'),
    "retire_cleanup": ("tuple of str", "the steps a door retire runs, from "
                       + ", ".join(RETIRE_CLEANUP_FULL) + " (RETIRE_CLEANUP_FULL: all)"),
    "checksum": ('"prompt" | "suffix"', "the KV checksum code the release has (0.5.21/22's "
                 "over the prompt, 0.5.23's over the suffix, skipped across layouts)"),
    "scenario_overrides": ("dict[str, dict[str, value]]", "scenario tables forced onto every "
                           "scenario: prefill, decode, options, events (as in a scenario file)"),
    "description": ("str", "shown in reports (default: the file's docstring)"),
}
DATA_FIELDS = set(FIELDS)


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


def _wrap(path: str, gp: g.GuardPoint, fn: Callable, limit: float) -> Callable:
    def guarded(*args):
        usercode.enter(gp.name, limit)
        try:
            out = fn(*args)
        except KeyboardInterrupt:
            raise
        except usercode.Overrun:
            raise ProposalError(f"{path}: {usercode.overrun_message(gp.name)}") from None
        except BaseException as exc:  # a bug in the proposal, reported in one line
            raise ProposalError(f"{path}: {gp.name} raised {usercode.describe(exc)}") from None
        finally:
            usercode.leave()
        if not gp.valid(out):
            raise ProposalError(f"{path}: {gp.name} returned {_short(out)} ({type(out).__name__}); "
                                f"it must return {gp.returns}")
        return out
    guarded.__name__ = getattr(fn, "__name__", gp.name)
    guarded.__doc__ = getattr(fn, "__doc__", None) or f"{gp.name} from {path}"
    guarded.__wrapped__ = fn
    return guarded


_short = messages.short


def _not_toml(path) -> str:
    return (f"{path}: a TOML file, not a proposal (a Python file: base = \"0.5.x\" and the "
            "guard points it replaces); a scenario goes to --scenario-file")


def _is_toml(text: str) -> bool:
    try:
        tomllib.loads(text)
        return True
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return False


def _import(path: str, p: pathlib.Path, limit: float):
    """The proposal file as a module: read as bytes, decoded as UTF-8 and
    compiled as Python source whatever its suffix; whatever it raises, a
    one-line ProposalError."""
    text = textfile.read(str(path), "proposal", ProposalError, "python")
    if p.suffix.lower() == ".toml":
        raise ProposalError(_not_toml(path))
    name = "reqmodel_proposal_" + "".join(c if c.isalnum() else "_" for c in p.stem)[:60]
    module = types.ModuleType(name)
    module.__file__ = str(p)
    usercode.enter("importing it", 2 * limit)
    try:
        exec(compile(text, str(p), "exec"), module.__dict__)  # noqa: S102 (trusted user code)
    except KeyboardInterrupt:
        raise
    except usercode.Overrun:
        raise ProposalError(f"{path}: {usercode.overrun_message('importing it')}") from None
    except SyntaxError as exc:
        if _is_toml(text):
            raise ProposalError(_not_toml(path)) from None
        line = f" (line {exc.lineno})" if exc.lineno else ""
        raise ProposalError(f"{path}: does not import: SyntaxError: {exc.msg}{line}") from None
    except BaseException as exc:
        if isinstance(exc, NameError) and _is_toml(text):  # [prefill] reads as a Python list
            raise ProposalError(_not_toml(path)) from None
        raise ProposalError(f"{path}: does not import: {usercode.describe(exc)}") from None
    finally:
        usercode.leave()
    return module


def _typed(path: str, module, field: str, types: tuple, what: str):
    value = getattr(module, field, None)
    if value is not None and not isinstance(value, types):
        raise ProposalError(f"{path}: {field} must be {what}, not {_short(value)} "
                            f"({type(value).__name__})")
    return value


def _overrides(path: str, value) -> Dict[str, Dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProposalError(f"{path}: scenario_overrides must be a dict of tables, not "
                            f"{type(value).__name__}")
    for table, values in value.items():
        if not isinstance(table, str):
            raise ProposalError(f"{path}: scenario_overrides: a table name must be a string, "
                                f"not {_short(table)}")
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            raise ProposalError(f"{path}: scenario_overrides[{_short(table)}] must be a dict "
                                "with string keys")
    return value


def load(path: str) -> Proposal:
    p = pathlib.Path(path)
    limit = usercode.guard_seconds()
    module = _import(path, p, limit)
    base_name = _typed(path, module, "base", (str,), "a release name such as \"0.5.20\"")
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
            shown = name if len(name) <= 40 else name[:37] + "..."
            raise ProposalError(
                f"{path}: {shown} is not a guard point (see 'reqmodel guard points'); "
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
        changes[name] = _wrap(path, gp, value, limit)
        replaced.append(name)
    cleanup = _typed(path, module, "retire_cleanup", (tuple, list),
                     f"a tuple of steps from {sorted(RETIRE_STEPS)}")
    if cleanup is not None:
        if not all(isinstance(x, str) and x in RETIRE_STEPS for x in cleanup):
            raise ProposalError(f"{path}: retire_cleanup must be a tuple of steps from "
                                f"{sorted(RETIRE_STEPS)}")
        changes["retire_cleanup"] = tuple(cleanup)
        replaced.append("retire_cleanup")
    checksum = _typed(path, module, "checksum", (str,), '"prompt" or "suffix"')
    if checksum is not None:
        if checksum not in ("prompt", "suffix"):
            raise ProposalError(f"{path}: checksum must be \"prompt\" or \"suffix\"")
        changes["checksum"] = CHECKSUMS[checksum]
        replaced.append("checksum")
    overrides = _overrides(path, getattr(module, "scenario_overrides", None))
    description = _typed(path, module, "description", (str,), "a string")
    if not replaced and not overrides:
        raise ProposalError(f"{path}: replaces no guard point and sets no option")
    name = p.stem
    release = attrs.evolve(base, name=f"{base.name}+{name}", **changes)
    doc = module.__doc__ if isinstance(module.__doc__, str) else ""
    prop = Proposal(path=str(path), name=name, release=release, base=base,
                    replaced=tuple(replaced), scenario_overrides=overrides,
                    description=(description or doc).strip())
    # before anything runs: the overrides on the default scenario, and what
    # every replaced guard can return on any path
    prop.apply(sc_mod.builtin(sc_mod.DEFAULT))
    _check_returns(prop)
    return prop


def _check_returns(prop: Proposal) -> None:
    """Refuse a guard that returns a wrong type on some path, or does not
    return at all, found by running it on symbolic requests
    (``guard_diff.paths``). A guard the symbolic encoding cannot follow
    (an integer field as an index, say) is left to the concrete checks."""
    from reqmodel.engines.z3 import guard_diff as symbolic
    points = prop.release.guard_points()
    for name in prop.replaced:
        if name not in g.GUARD_POINTS:
            continue
        try:
            symbolic.paths(name, points[name])
        except symbolic.BadGuard as exc:
            raise ProposalError(f"{prop.path}: {exc}") from None
        except symbolic.SymbolicError:
            continue
