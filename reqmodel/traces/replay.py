"""Replay a recorded trace on a release: which step is the first whose guard
is not enabled, and is the property still violated."""
from __future__ import annotations

import pathlib
from typing import Optional

import attrs

from reqmodel.traces import itf
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.engines.exhaustive import replay
from reqmodel.model.properties import CATALOG, Property
from reqmodel.model.properties import Kind


@attrs.frozen
class Loaded:
    meta: dict
    steps: tuple
    release: releases.Release
    scenario: scenario.Scenario
    property: Property


def load(path, release: Optional[str] = None, guards: Optional[str] = None) -> Loaded:
    """Read a trace file and resolve what it names; every problem is one line.
    ``guards`` is a proposal file: the trace then replays on that proposal."""
    meta, steps = itf.read(path)
    prop_file = None
    if guards is None and release is None and meta.get("guards"):
        guards = meta["guards"]  # a trace made by `reqmodel guard check`
        if not pathlib.Path(guards).is_file():
            raise itf.TraceFileError(f"{path}: made on proposal {guards}, which is not here; "
                                     "pass --guards FILE or --release")
    if guards is not None:
        from reqmodel.proposals import proposal
        prop_file = proposal.load(guards)
        rel = prop_file.release
    else:
        if release is not None and not release.strip():
            raise itf.TraceFileError("--release: an empty release name")
        name = release if release is not None else meta.get("release")
        if not name:
            raise itf.TraceFileError(f"{path}: the trace names no release; pass --release")
        from reqmodel.proposals import mutants
        # a mutant's trace (the corpus keeps the ones that show a property can fail)
        rel = mutants.MUTANTS[name] if name in mutants.MUTANTS else releases.get(name)
    if "scenario_config" in meta:
        try:
            sc = scenario.from_dict(meta["scenario_config"], bounds=scenario.SAMPLED)
        except scenario.ScenarioError as exc:
            raise itf.TraceFileError(f"{path}: bad scenario_config: {exc}") from None
    elif "scenario" in meta:
        sc = scenario.builtin(meta["scenario"])
    else:
        raise itf.TraceFileError(f"{path}: the trace names no scenario")
    if prop_file is not None:
        sc = prop_file.apply(sc)
    prop = CATALOG.get(meta.get("property", ""))
    if prop is None:
        raise itf.TraceFileError(f"{path}: unknown property {meta.get('property')!r}")
    for i, st in enumerate(steps, start=1):
        if not 0 <= st.rid < sc.n:
            raise itf.TraceFileError(f"{path}: state {i}: request {st.rid} is not in the scenario")
    return Loaded(meta, steps, rel, sc, prop)


@attrs.frozen
class Outcome:
    property: str
    release: str
    steps_total: int
    steps_replayed: int
    first_disabled_step: Optional[int]  # 1-based step number, None when all replayed
    violated: bool  # safety: broken on the replayed prefix; reachability: good state not reached
    violated_at: Optional[int]  # 1-based step at which it broke (0: the initial state)
    states: tuple
    events: tuple
    why_not: str = ""  # why the first disabled step cannot be taken
    # the timing relations the replayed steps need (``clocks.needs``)
    timing: tuple = ()

    def as_json(self) -> dict:
        out = {"property": self.property, "release": self.release,
               "steps_replayed": self.steps_replayed,
               "first_disabled_step": self.first_disabled_step, "violated": self.violated,
               "timing": [n.to_json() for n in self.timing]}
        if self.why_not:
            out["why_not"] = self.why_not
        return out


def run(loaded: Loaded) -> Outcome:
    from reqmodel.model import clocks
    from reqmodel.model.actions import Ctx
    out = _run(loaded)
    ctx = Ctx(loaded.release, loaded.scenario)
    out = attrs.evolve(out, timing=tuple(clocks.needs(
        ctx, out.states, loaded.steps[:out.steps_replayed])))
    if out.first_disabled_step is None:
        return out
    from reqmodel.model.actions.core import why_not
    k = out.first_disabled_step - 1
    return attrs.evolve(out, why_not=why_not(ctx, out.states[k], loaded.steps[k]))


def _run(loaded: Loaded) -> Outcome:
    states, events, disabled = replay(loaded.release, loaded.scenario, loaded.steps)
    p = loaded.property
    at = None
    if p.kind.on_graph:
        violated = disabled is None and _liveness_violated(loaded, states)
        return Outcome(p.name, loaded.release.name, len(loaded.steps), len(states) - 1,
                       None if disabled is None else disabled + 1, violated,
                       len(states) - 1 if violated else None, tuple(states), tuple(events))
    if p.kind == Kind.SOMETIMES:
        reached = any(p.holds_in(s) for s in states)
        violated = not reached
    else:
        if not p.holds_in(states[0]):
            at = 0
        else:
            at = next((i + 1 for i in range(len(events))
                       if p.hit(states[i], loaded.steps[i], events[i], states[i + 1])), None)
        violated = at is not None
    return Outcome(p.name, loaded.release.name, len(loaded.steps), len(states) - 1,
                   None if disabled is None else disabled + 1, violated, at,
                   tuple(states), tuple(events))


def violating_last(loaded: Loaded, out: Outcome) -> bool:
    """Whether a rendering marks the last step as the violating one: a safety
    or liveness trace that replays violated (a lasso marks its loop instead)."""
    return ((loaded.property.kind == Kind.ALWAYS or loaded.property.kind.on_graph)
            and out.violated and loaded.meta.get("loop") is None)


def _liveness_violated(loaded: Loaded, states) -> bool:
    """A liveness trace replays as a violation when, on this release, its
    request still waits at the end with no own way to its goal (a search
    from the last state; for a ``bounded`` property, and no timeout armed on
    the way either), or, for a lasso (``loop``), when the steps from
    ``loop`` on return to that state, never let the request reach its goal,
    and form a fair cycle."""
    from reqmodel.engines import liveness
    from reqmodel.model.actions import Ctx
    p = loaded.property
    ctx = Ctx(loaded.release, loaded.scenario)
    rid = loaded.meta.get("request")
    rids = [rid] if isinstance(rid, int) and 0 <= rid < loaded.scenario.n else range(
        loaded.scenario.n)
    loop = loaded.meta.get("loop")
    if loop is not None:
        cycle = states[loop:]
        return any(all(p.pending(s, r) for s in cycle)
                   and liveness.cycle_is_fair(ctx, cycle, loaded.steps[loop:]) for r in rids)
    last = states[-1]
    timeouts = p.kind == Kind.BOUNDED
    return any(p.pending(last, r)
               and liveness.can_answer(ctx, last, r, p.goal, timeouts=timeouts) is False
               for r in rids)
