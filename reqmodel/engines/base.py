"""One engine interface, in Stateright's spirit.

An engine is one class with one method, ``check(release, scenario,
properties)``, returning one :class:`Result` per property in one verdict
vocabulary (:class:`Answer`). None of them knows the protocol: each consumes
the model's actions and property catalog. :func:`run` drives any engine over
releases x scenarios and writes the traces; :data:`ENGINES` is the one table
that ``reqmodel check``, ``reqmodel guard check`` and the CLI choose from.

- ``exhaustive``: breadth-first search of every interleaving; a verdict is
  final and a counterexample is a shortest one.
- ``hypothesis``: samples interleavings and minimises what it finds; a
  ``holds`` means none was found within the profile's budget.
- ``z3``: bounded model checking on the actions' learned paths; a violation is
  a shortest one, ``holds-to-depth`` / ``unreached-to-depth`` are bounded
  answers, and ``proved`` marks a verdict that holds at every depth.
"""
from __future__ import annotations

import enum
import hashlib
import pathlib
import re
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import attrs

from reqmodel import messages
from reqmodel.engines.exhaustive import DEFAULT_MAX_STATES, Trace, explore
from reqmodel.model import clocks
from reqmodel.model.actions import Ctx
from reqmodel.model.properties import Kind, Property
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.traces import itf


class EngineInputError(ValueError):
    """A scenario or bound an engine cannot take; one line for the user."""


class NetBoundError(EngineInputError):
    """The Z3 engine's state vector has too few message slots for the scenario."""


class Answer(enum.StrEnum):
    """The verdict vocabulary every engine answers in."""

    HOLDS = "holds"  # safety: no violation; reachability: the good state is reached
    VIOLATED = "violated"  # safety: a counterexample; reachability: the good state is unreachable
    NOT_APPLICABLE = "not-applicable"  # the property says nothing on this release x scenario
    # the property applies, but this engine (or mode) cannot decide it: the
    # note says what can (a liveness property without the state graph)
    NOT_CHECKED = "not-checked"
    HOLDS_TO_DEPTH = "holds-to-depth"  # z3: no violation of at most `depth` steps
    UNREACHED_TO_DEPTH = "unreached-to-depth"  # z3: not within `depth` steps; hypothesis: not in its samples


@attrs.frozen
class Result:
    """One engine's answer for one property on one release x scenario."""

    release: str
    scenario: str
    property: str
    kind: str
    verdict: Answer
    trace_file: Optional[str]
    states: Optional[int]
    seconds: float
    engine: str = "exhaustive"
    examples: Optional[int] = None  # hypothesis: test cases run
    steps: Optional[int] = None  # hypothesis: model steps executed
    runs: Optional[int] = None  # hypothesis: runs of the scenario (several per test case)
    depth: Optional[int] = None  # z3: the depth searched
    clauses: Optional[int] = None  # z3: paths of the actions learned
    refinements: Optional[int] = None  # z3: sequences into states with a path not learned yet
    proved: bool = False  # z3: the verdict holds for every depth (no simple path was left)
    note: Optional[str] = None  # why a verdict is not-applicable, or what part was checked
    # the counterexample (or witness) and what its trace file's #meta adds
    trace: Optional[Trace] = attrs.field(default=None, eq=False, repr=False)
    trace_meta: Dict = attrs.field(factory=dict, eq=False, repr=False)
    # the timeout settings a counterexample needs (``clocks.needs``)
    timing: Tuple = attrs.field(default=(), eq=False, repr=False)

    @property
    def trace_length(self) -> Optional[int]:
        return None if self.trace is None else len(self.trace)

    def as_json(self) -> dict:
        out = {"release": self.release, "scenario": self.scenario, "property": self.property,
               "verdict": str(self.verdict), "trace_length": self.trace_length,
               "trace_file": self.trace_file, "states": self.states,
               "seconds": round(self.seconds, 3)}
        if self.note:
            out["note"] = self.note
        if self.timing:
            out["timing"] = [n.to_json() for n in self.timing]
        if self.engine == "hypothesis":
            out.update(engine="hypothesis", examples=self.examples, runs=self.runs,
                       steps=self.steps)
        if self.engine == "z3":
            out.update(engine="z3", depth=self.depth, proved=self.proved, clauses=self.clauses,
                       refinements=self.refinements)
        return out


class Exhaustive:
    """Every interleaving, breadth first (``reqmodel.engines.exhaustive``)."""

    name = "exhaustive"

    def __init__(self, max_states: int = DEFAULT_MAX_STATES, workers: int = 1,
                 fingerprints: bool = False, ray: Optional[str] = None) -> None:
        self.max_states = max_states
        self.workers = workers  # processes (``engines.parallel``); the answer is the same
        # the address of a Ray cluster whose actors hold the shards
        # (``engines.raycluster``); the answer is the same
        self.ray = ray
        # the visited set as 64-bit fingerprints (one process): the graph
        # properties are then checked in their deadlock forms, as by the
        # engines that see no graph
        self.fingerprints = fingerprints

    def check(self, release: Release, scenario: Scenario,
              props: Sequence[Property]) -> List[Result]:
        refuse_large(scenario, self.max_states, self.fingerprints)
        if self.fingerprints:
            return partial_forms(self, release, scenario, props,
                                 lambda ps: self._check(release, scenario, ps))
        return self._check(release, scenario, props)

    # how to check a graph property whole, where it gets its partial form
    whole_graph = "check without --fingerprints"

    def _check(self, release: Release, scenario: Scenario,
               props: Sequence[Property]) -> List[Result]:
        ex = explore(release, scenario, props, max_states=self.max_states, keep_graph=False,
                     workers=self.workers, fingerprints=self.fingerprints, ray=self.ray)
        return [Result(release.name, scenario.name, p.name, p.kind, Answer(v.verdict),
                       None, ex.states, ex.seconds, self.name, trace=v.trace)
                for p in props for v in (ex.verdicts[p.name],)]


def refuse_large(scenario: Scenario, max_states: int = DEFAULT_MAX_STATES,
                 fingerprints: bool = False) -> None:
    """One line for a scenario the exhaustive engine does not take: beyond
    its hard bounds (a large built-in one is loaded with the sampled bounds,
    so the engine asks again), a large built-in one (the Hypothesis
    engine's), or one whose estimated states exceed --max-states or the
    machine's memory even at the estimate's low end (``estimate.refusal``)."""
    from reqmodel.engines import estimate
    from reqmodel.model import scenario as sc_mod
    refusal = sc_mod.exhaustive_refusal(scenario)
    if refusal is not None:
        raise EngineInputError(f"{refusal}; --engine hypothesis answers it")
    name = messages.short(scenario.name)
    if scenario.name in sc_mod.large_names() and scenario == sc_mod.builtin(scenario.name):
        raise EngineInputError(
            f"scenario {name} is a large built-in one ({estimate.estimate(scenario).describe()}): "
            "--engine hypothesis answers it; a copy of its file runs exhaustively up to "
            "--max-states")
    refusal = estimate.refusal(scenario, max_states, fingerprints)
    if refusal is not None:
        raise EngineInputError(f"scenario {name}: {refusal}: use fewer requests, events or "
                               "ranks, or --engine hypothesis")


def without_graph(release: Release, scenario: Scenario, props: Sequence[Property]
                  ) -> List[Property]:
    """``props`` for a search that keeps no graph: each liveness property
    (``Kind.on_graph``) that applies and has a partial form is given as
    that form, a state predicate under the property's own name, after the
    others; the other liveness properties are left out."""
    ctx = Ctx(release, scenario)
    return [p for p in props if not p.kind.on_graph] + [
        attrs.evolve(p, kind=Kind.ALWAYS, state=p.state_check(ctx))
        for p in props if p.kind.on_graph and p.partial is not None
        and p.applies(release, scenario)]


def partial_forms(engine, release: Release, scenario: Scenario, props: Sequence[Property], check
                  ) -> List[Result]:
    """``check(props)`` for an engine that sees no state graph: a liveness
    property (``Kind.on_graph``) is checked in its partial form, a state
    predicate, when it has one, and reported ``violated`` when that breaks
    (a deadlock is a violation of the whole property too); otherwise it is
    ``not-checked`` with the property's own one-line reason (``not-applicable``
    where the property says nothing)."""
    got = {r.property: r for r in check(without_graph(release, scenario, props))}
    out = []
    for p in props:
        r = got.get(p.name)
        if not p.kind.on_graph:
            out.append(r)
        elif r is not None and r.verdict == Answer.VIOLATED:
            out.append(attrs.evolve(r, kind=p.kind, note="violated in its deadlock form"))
        else:
            applies = p.applies(release, scenario)
            note = f"{p.partial_note}: {engine.whole_graph}" if applies else None
            out.append(Result(release.name, scenario.name, p.name, p.kind,
                              Answer.NOT_CHECKED if applies else Answer.NOT_APPLICABLE,
                              None, None, 0.0 if r is None else r.seconds, engine.name,
                              note=note))
    return out


# the note of a cell whose search the time budget ended (a 'holds' there means
# none found in the examples run)
BUDGET_NOTE = "the time budget ended the search"


class Budget:
    """A time budget for a whole command, shared out as it goes: each cell
    (a property, or a release x scenario pair for Z3) gets an equal part of
    what is left, so a cell that finishes early leaves its rest to the
    others. ``cells`` is how many the command will check (set by the caller;
    one if unknown)."""

    def __init__(self, seconds: float, cells: int = 1) -> None:
        self.seconds, self.cells_left = seconds, max(1, cells)
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.cut = 0  # cells (a property on a release and scenario) the budget ended early

    def next_deadline(self) -> float:
        now = time.monotonic()
        share = max(0.0, self.end - now) / max(1, self.cells_left)
        self.cells_left = max(1, self.cells_left - 1)
        return now + share

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


class Hypothesis:
    """Sampled interleavings, minimised (``reqmodel.engines.hypothesis``).
    With a :class:`Budget`, each release x scenario pair searches for all its
    properties at once (``check_together``) until the profile's examples
    since its last find or its share of the budget, whichever comes first;
    ``progress(info)`` is called after each chunk of examples. Without one,
    each property has its own search of the profile (the pinned ``ci``
    table)."""

    name = "hypothesis"
    whole_graph = "use the exhaustive engine"

    def __init__(self, profile: str = "ci", budget: Optional[Budget] = None,
                 progress: Optional[Callable[[Dict], None]] = None) -> None:
        self.profile, self.budget, self.progress = profile, budget, progress
        self.examples = self.runs = self.steps = 0  # over every cell checked so far

    def check(self, release: Release, scenario: Scenario,
              props: Sequence[Property]) -> List[Result]:
        return partial_forms(self, release, scenario, props,
                             lambda ps: self._check(release, scenario, ps))

    def _check(self, release: Release, scenario: Scenario,
               props: Sequence[Property]) -> List[Result]:
        from reqmodel.engines.hypothesis import engine as hypo
        if self.budget is not None:  # one search for every property, as long as its share
            on_chunk = None
            if self.progress is not None:
                def on_chunk(stats, open_):
                    self.progress({"release": release.name, "scenario": scenario.name,
                                   "property": f"{open_} open",
                                   "examples": self.examples + stats.examples,
                                   "left": self.budget.left()})
            got = hypo.check_together(release, scenario, props, self.profile,
                                      self.budget.next_deadline(), on_chunk)
            hvs = [got[p.name] for p in props]
            done = max(hvs, key=lambda hv: hv.examples, default=None)  # the whole search
            searched = [] if done is None else [done]
        else:
            hvs = searched = [hypo.check_property(release, scenario, p, self.profile)
                              for p in props]
        self.examples += sum(hv.examples for hv in searched)
        self.runs += sum(hv.runs for hv in searched)
        self.steps += sum(hv.steps for hv in searched)
        out = []
        for p, hv in zip(props, hvs):
            if hv.cut:
                self.budget.cut += 1
            v = hv.verdict
            answer = Answer(v.verdict)
            if p.kind == Kind.SOMETIMES and answer == Answer.VIOLATED:
                # sampling that did not reach the good state says nothing of
                # whether it is reachable
                answer = Answer.UNREACHED_TO_DEPTH
            out.append(Result(release.name, scenario.name, p.name, p.kind, answer,
                              None, None, hv.seconds, self.name, hv.examples,
                              hv.steps, hv.runs, trace=v.trace,
                              note=(BUDGET_NOTE if hv.cut else None),
                              trace_meta={"profile": self.profile, "examples": hv.examples,
                                          "runs": hv.runs, "hypothesis_length": hv.shrunk_length}))
        return out


class Z3:
    """Bounded model checking with Z3 (``reqmodel.engines.z3.bmc``)."""

    name = "z3"
    whole_graph = "use the exhaustive engine"
    # bmc's own words, in the one vocabulary: a reached good state is
    # "holds" (with the path's length), a proof is "holds" (an unreachable
    # good state, "violated"), as in the exhaustive engine
    ANSWERS = {"violated": Answer.VIOLATED, "reached": Answer.HOLDS, "proved": Answer.HOLDS,
               "unreachable": Answer.VIOLATED, "holds-to-depth": Answer.HOLDS_TO_DEPTH,
               "unreached-to-depth": Answer.UNREACHED_TO_DEPTH}
    DEFAULT_DEPTH = 12
    MAX_DEPTH = 60

    def __init__(self, depth: int = DEFAULT_DEPTH, max_net: int = 8,
                 seconds: Optional[float] = None, budget: Optional[Budget] = None,
                 progress: Optional[Callable[[Dict], None]] = None) -> None:
        """``seconds``: a limit per release x scenario; ``budget``: one for
        the whole command, shared out over its pairs; ``progress(info)`` as
        each depth is learned and searched."""
        self.depth, self.max_net, self.seconds, self.budget = depth, max_net, seconds, budget
        self.progress = progress

    def check(self, release: Release, scenario: Scenario,
              props: Sequence[Property]) -> List[Result]:
        return partial_forms(self, release, scenario, props,
                             lambda ps: self._check(release, scenario, ps))

    def _check(self, release: Release, scenario: Scenario,
               props: Sequence[Property]) -> List[Result]:
        from reqmodel.engines.z3 import bmc
        applicable = [p for p in props if p.applies(release, scenario)]
        from reqmodel.engines.z3 import action_paths
        try:
            seconds = self.seconds
            if self.budget is not None and applicable:
                seconds = max(0.0, self.budget.next_deadline() - time.monotonic())
            log = None
            if self.progress is not None:
                def log(k, refinements, paths, answered):
                    self.progress({"release": release.name, "scenario": scenario.name,
                                   "depth": k, "max_depth": self.depth, "answered": answered,
                                   "open": len(applicable) - answered, "paths": paths,
                                   "left": None if self.budget is None else self.budget.left()})
            res = (bmc.run(release, scenario, applicable, self.depth, max_net=self.max_net,
                           seconds=seconds, log=log) if applicable else {})
        except action_paths.NetBound as e:
            raise NetBoundError(str(e)) from None
        except bmc.TooManyPaths as e:
            raise EngineInputError(str(e)) from None
        out = []
        if self.budget is not None:  # the cells whose search stopped short of the depth
            # (a liveness property's deadlock form is reported not-checked, so not one)
            whole = {p.name for p in applicable if p.partial is None}
            self.budget.cut += sum(1 for name, r in res.items() if name in whole
                                   and r.depth < self.depth
                                   and r.verdict in ("holds-to-depth", "unreached-to-depth"))
        for p in props:
            r = res.get(p.name)
            if r is None:
                out.append(Result(release.name, scenario.name, p.name, p.kind,
                                  Answer.NOT_APPLICABLE, None, None, 0.0, self.name,
                                  depth=self.depth))
                continue
            out.append(Result(release.name, scenario.name, p.name, p.kind, self.ANSWERS[r.verdict],
                              None, None, r.seconds, self.name, depth=r.depth,
                              clauses=r.clauses, refinements=r.refinements,
                              proved=r.verdict in ("proved", "unreachable"), trace=r.trace,
                              trace_meta={"depth": self.depth}))
        return out


# the one table of engines: name -> class
ENGINES = {e.name: e for e in (Exhaustive, Hypothesis, Z3)}


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, limit: int = 80) -> str:
    """A file-name part from user text (a scenario or proposal name): letters,
    digits, ``.``, ``_`` and ``-`` only, no leading dot, at most ``limit``
    characters. A name that had to change gets a digest of the original, so
    two names never meet in one file; a safe name stays as it is."""
    name = _UNSAFE.sub("_", text).lstrip(".")[:limit] or "unnamed"
    if name != text:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        name = f"{name}-{digest}"
    return name


def trace_path(out: pathlib.Path, release: str, prop: str, scenario: str) -> pathlib.Path:
    """Where a trace goes: always inside ``out``, whatever the names hold."""
    return out / safe_name(release) / f"{safe_name(prop)}-{safe_name(scenario)}.itf.json"


def run(engine, releases: Sequence[Release], scenarios: Sequence[Scenario],
        props: Sequence[Property], out: Optional[pathlib.Path],
        progress: Optional[Callable] = None, write_witnesses: bool = False) -> List[Result]:
    """``engine.check`` on each (scenario, release) pair, in that order.

    Counterexamples of violated properties are written under ``out`` (and
    witnesses of reachability properties when ``write_witnesses``), once
    every pair has been checked, so that a scenario refused part-way leaves
    no file of the earlier ones; ``progress(scenario, release, results)`` is
    called after each pair."""
    results: List[Result] = []
    pending = []  # written once every pair is checked: a refusal leaves no file
    for sc in scenarios:
        for rel in releases:
            pair = engine.check(rel, sc, props)
            for r in pair:
                path = None
                if (r.trace is not None and out is not None
                        and (r.verdict == Answer.VIOLATED or write_witnesses)):
                    path = trace_path(out, rel.name, r.property, sc.name)
                    pending.append((path, r, sc))
                timing = (tuple(clocks.needs(Ctx(rel, sc), r.trace.states, r.trace.steps))
                          if r.trace is not None and r.verdict == Answer.VIOLATED else ())
                results.append(attrs.evolve(r, trace_file=None if path is None else str(path),
                                            timing=timing))
            if progress is not None:
                progress(sc, rel, pair)
    for path, r, sc in pending:
        itf.write(path, r.trace, sc, engine=engine.name, extra_meta=r.trace_meta or None)
    return results
