"""Exhaustive breadth-first exploration with shortest counterexamples.

The explorer knows nothing of SGLang: it consumes the model interface
(initial state, ``successors``, the property catalog) the way Stateright's
checkers consume a ``Model``.  States are stored in canonical form
(``reqmodel.symmetry``), hashed once (``cache_hash``), and interned so that
equal sub-values are shared.  The reachable graph is a ``networkx.DiGraph``
on integer state ids with action-labelled edges.

Breadth-first order makes every first hit minimal: a state property first
violated in a state at depth k has a shortest counterexample of k steps; a
transition property first violated on an edge out of a state at depth k has
one of k+1 steps.  Each counterexample is mapped back from canonical states to
concrete, replayable steps (``concretize``).
"""
from __future__ import annotations

import array
import collections
import contextlib
import gc
import time
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import attrs
import networkx as nx

from reqmodel.engines import liveness
from reqmodel.model.actions import BY_NAME, Ctx, Event, Step, apply, initial_state, successors
from reqmodel.model.properties import Every, Property
from reqmodel.model.releases import Release
from reqmodel.model.scenario import EVENT_NAMES, Scenario
from reqmodel.model.state import State
from reqmodel.engines.symmetry import canonical, FormMemo, ReprKey
from reqmodel.model.properties import Kind


class BoundExceeded(RuntimeError):
    """The scenario's reachable space is larger than the configured bound."""

    @classmethod
    def of(cls, max_states: int, scenario: Scenario, release: Release) -> "BoundExceeded":
        return cls(f"more than {max_states:,} distinct states on scenario "
                   f"{scenario.name!r} ({release.name}); reduce the scenario or raise "
                   "--max-states if the machine has the memory")


# ~0.6 KB a state without the graph, ~2.1 KB with it (notes/performance.md):
# 1.5M states stay under 4 GB either way.
DEFAULT_MAX_STATES = 1_500_000


@attrs.frozen
class Trace:
    release: str
    scenario: str
    property: str
    steps: Tuple[Step, ...]
    states: Tuple[State, ...]  # len(steps) + 1 concrete states
    events: Tuple[Tuple[Event, ...], ...]  # per step
    violation: str  # "state" | "transition" | "reached" | "stuck" | "lasso"
    # liveness: the request left waiting; for a lasso, the index of the state
    # the last state equals (the loop is steps[loop:]); for a stuck state,
    # the timeouts that can end the wait: (action, request, env var, seconds)
    rid: Optional[int] = None
    loop: Optional[int] = None
    ends_by: Tuple[Tuple[str, int, str, float], ...] = ()

    def __len__(self) -> int:
        return len(self.steps)


@attrs.frozen
class Verdict:
    property: str
    kind: str
    verdict: str  # holds | violated | not-applicable
    trace: Optional[Trace] = None

    @property
    def trace_length(self) -> Optional[int]:
        return None if self.trace is None else len(self.trace)


@attrs.define
class Exploration:
    release: Release
    scenario: Scenario
    verdicts: Dict[str, Verdict]
    states: int
    edges: int
    depth: int
    seconds: float
    complete: bool
    graph: Optional[nx.DiGraph] = None
    state_of: Optional[List[State]] = None  # node id -> canonical state, with the graph
    fired: FrozenSet[str] = frozenset()  # every action taken on some explored edge
    emitted: FrozenSet[str] = frozenset()  # every event kind emitted on some explored edge
    workers: int = 1  # processes the search ran on (``engines.parallel``)


class Checks:
    """The applicable properties, split by when the explorer checks them:
    state and reachability properties on each new state; transition
    properties on each step, those over events of some classes
    (``properties.Every``) only on steps with such an event."""

    def __init__(self, applicable: Sequence[Property]) -> None:
        self.state = [p for p in applicable if p.kind == Kind.ALWAYS and p.state]
        self.reach = [p for p in applicable if p.kind == Kind.SOMETIMES]
        trans = [p for p in applicable if p.kind == Kind.ALWAYS and p.transition]
        self.always = [p for p in trans if not isinstance(p.transition, Every)]
        self.by_event: Dict[type, List[Property]] = {}
        for p in trans:
            if isinstance(p.transition, Every):
                for cls in p.transition.events:
                    self.by_event.setdefault(cls, []).append(p)

    def on_state(self, s: State, found) -> List[Tuple[str, str]]:
        """(name, "state" | "reached") of each property not in ``found``
        that ``s`` violates, or reaches."""
        return ([(p.name, "state") for p in self.state
                 if p.name not in found and not p.holds_in(s)]
                + [(p.name, "reached") for p in self.reach
                   if p.name not in found and p.holds_in(s)])

    def on_step(self, s: State, step: Step, evs, nxt: State, found) -> List[str]:
        """The transition properties not in ``found`` that this step violates."""
        props = self.always if not evs else self.always + [
            p for cls in {type(e) for e in evs} for p in self.by_event.get(cls, ())]
        return [p.name for p in props
                if p.name not in found and not p.transition(s, step, evs, nxt)]


class _Interner:
    """Hash-consing of sub-values, so that a million states share their parts.

    The state's fields come from ``attrs.fields(State)``: a field marked
    ``intern="each"`` (the per-request and per-room records) is interned
    element by element, every other field as one value, in a table of its
    own: ``(False, False) == (0, 0)``, and ``room_slots`` must not come back
    as ``aborted_by_client``'s bools."""

    def __init__(self) -> None:
        self.table: Dict[object, object] = {}  # the records of "each" fields
        self.fields = tuple((f.name, None if f.metadata.get("intern") == "each" else {})
                            for f in attrs.fields(State))

    def __call__(self, s: State) -> State:
        t = self.table
        return State(*[tuple([t.setdefault(x, x) for x in getattr(s, name)]) if own is None
                       else own.setdefault(getattr(s, name), getattr(s, name))
                       for name, own in self.fields])


def symmetry_classes(sc: Scenario, permute_requests: bool = True) -> Tuple[Tuple, ...]:
    """Requests permute only when nothing in the scenario tells them apart:
    the same prompt length and the same events (an abort allowed on request 0
    only makes request 0 different from an equal request 1).  Without
    ``permute_requests`` every request is its own class (liveness follows one
    request along a path)."""
    # a request that shares its room is told apart by its place in the room's
    # order of use (the later user starts only after the earlier one)
    return tuple((pages, tuple(sc.events.on(e, r) for e in EVENT_NAMES),
                  r if len(sc.room_sharers(r)) > 1 or not permute_requests else -1)
                 for r, pages in enumerate(sc.prompt_pages))


def canonicaliser(scenario: Scenario, graph_props: bool, symmetry: bool = True):
    """The map from a state to its stored representative."""
    if not symmetry:
        return lambda s: s
    classes = symmetry_classes(scenario, permute_requests=not graph_props)
    ranks, pranks = scenario.decode.ranks, scenario.prefill.ranks
    key, memo = ReprKey(), FormMemo()
    return lambda s: canonical(s, classes, ranks, pranks, key, memo)


@contextlib.contextmanager
def paused_gc():
    """Python's cycle collector paused.  The stored states form no cycles,
    yet every full collection walks all of them: on optimistic-abort-unit
    the collector took 5 % of the one-process search and 31 % of the
    parallel engine's rounds (notes/performance.md).  The
    few cycles a search makes are collected once it is over."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# Called now and then during a search (every PROGRESS_EVERY new states, and
# after each round of the parallel engine) with a dict of states, depth (the
# level being expanded), frontier (states waiting) and seconds; set by the
# command line for its status line (``reporting``), None otherwise.
on_progress: Optional[Callable[[Dict], None]] = None
PROGRESS_EVERY = 4096


@contextlib.contextmanager
def reporting(callback: Callable[[Dict], None]):
    """Report progress to ``callback`` while the block runs."""
    global on_progress
    old, on_progress = on_progress, callback
    try:
        yield
    finally:
        on_progress = old


def explore(release: Release, scenario: Scenario, props: Sequence[Property],
            max_states: int = DEFAULT_MAX_STATES, stop_early: bool = True,
            keep_graph: bool = True, symmetry: bool = True,
            edge_events: bool = False, keep_states: bool = False,
            workers: int = 1, fork_at: Optional[int] = None,
            fingerprints: bool = False, ray=None) -> Exploration:
    """Explore the reachable states of ``scenario`` under ``release``.

    With ``stop_early`` the search ends once every property has a verdict that
    further search cannot change (every safety property violated, every
    reachability property reached); otherwise it exhausts the space.
    With ``edge_events`` each graph edge also keeps the step's events (the
    cost analysis of ``reqmodel guard`` reads them; nothing else pays for it).
    ``state_of`` (every canonical state, in breadth-first order) is returned
    with the graph, or alone with ``keep_states``.
    With ``workers`` > 1 and no graph, the search goes on over that many
    processes (``engines.parallel``) from the first level that holds
    ``fork_at`` states (default ``parallel.FORK_AT``), with the same result.
    With ``fingerprints`` the visited set keeps a 64-bit fingerprint of each
    canonical state (its hash) instead of the state, and only the frontier's
    states are held (TLC's fingerprint set; one process): a fraction of the
    memory, for safety and reachability properties (the graph properties
    need the states: refused here). Two states with one fingerprint would
    make the second look visited; at a million states the chance of any such
    pair is about 1 in 10 million (n^2 / 2^65).
    With ``ray`` (a cluster's address, ``local`` for one on this machine, or
    a ``raycluster.Actors``) the ``workers`` shards are actors on that Ray
    cluster (``engines.raycluster``) instead of forked processes, with the
    same result.
    """
    if fingerprints and (keep_graph or keep_states or any(
            p.kind.on_graph and p.applies(release, scenario) for p in props)):
        raise ValueError("fingerprints keep no states: no graph, no states kept, "
                         "no graph properties")
    if ray is not None and (keep_graph or fingerprints):
        raise ValueError("a Ray search keeps no graph and no fingerprints")
    switch = None
    if (workers > 1 or ray is not None) and not keep_graph and not fingerprints:
        from reqmodel.engines import parallel
        at = parallel.FORK_AT if fork_at is None else fork_at
        cluster = None
        if ray is not None:
            from reqmodel.engines import raycluster
            cluster = ray if isinstance(ray, raycluster.Actors) else raycluster.Actors(ray)
        switch = (at, lambda pre: parallel.resume(pre, workers, max_states, stop_early,
                                                  keep_states, cluster))
    with paused_gc():
        return _explore(release, scenario, props, max_states, stop_early, keep_graph, symmetry,
                        edge_events, keep_states, switch, fingerprints)


def _explore(release: Release, scenario: Scenario, props: Sequence[Property], max_states: int,
             stop_early: bool, keep_graph: bool, symmetry: bool, edge_events: bool,
             keep_states: bool, switch, fingerprints: bool = False) -> Exploration:
    ctx = Ctx(release=release, scenario=scenario)
    applicable = [p for p in props if p.applies(release, scenario)]
    graph_props = [p for p in applicable if p.kind.on_graph]
    canon = canonicaliser(scenario, bool(graph_props), symmetry)
    intern = _Interner()
    t0 = time.perf_counter()

    checks = Checks(applicable)
    found: Dict[str, Tuple] = {}  # name -> ("state", id) | ("transition", u, step) | ("reached", id)

    init = intern(canon(initial_state(scenario)))
    ids: Dict[State, int] = {init: 0}
    states: List[State] = [init]  # by id
    parent: List[Tuple[int, Optional[Step]]] = [(-1, None)]
    depth: List[int] = [0]
    frontier: Optional[Dict[int, State]] = None
    if fingerprints:
        # ``seen`` (the visited set, in place of ``ids``) holds the states'
        # hashes, ``states`` (by id) their hashes too, ``parent`` the
        # parent's id (a trace's steps are found again by ``concretize``),
        # and ``frontier`` the states to expand
        seen = {hash(init)}
        states, parent, depth = array.array("q", [hash(init)]), array.array("q", [-1]), \
            array.array("l", [0])
        frontier = {0: init}
    graph = nx.DiGraph() if keep_graph else None
    if graph is not None:
        graph.add_node(0)
    edges = 0
    # graph properties need every edge: stop_early never stops before them
    ledges = liveness.Edges() if graph_props else None
    fired = set()
    emitted = set()

    for name, kind in checks.on_state(init, found):
        found[name] = (kind, 0)
    queue = collections.deque([0])
    complete = True
    level = 0
    while queue:
        if stop_early and len(found) == len(applicable):
            complete = False
            break
        if switch is not None and depth[queue[0]] != level:
            # a new level: the queue holds all of it and nothing else
            level = depth[queue[0]]
            if len(queue) >= switch[0]:
                from reqmodel.engines import parallel
                return switch[1](parallel.Prefix(
                    ctx, props, applicable, checks, canon, intern, ids, states, parent, depth,
                    found, fired, emitted, edges, ledges, t0))
        u = queue.popleft()
        s = states[u] if frontier is None else frontier.pop(u)
        for step, nxt, evs in successors(ctx, s):
            fired.add(step.action)
            if evs:
                emitted.update(e.kind for e in evs)
            for name in checks.on_step(s, step, evs, nxt, found):
                found[name] = ("transition", u, step)
            # a successor that is already a stored representative is its own
            # canonical form (canonical forms are idempotent): no relabelling
            new = None
            if frontier is None:
                v = ids.get(nxt)
                if v is None:
                    c = canon(nxt)
                    v = ids.get(c)
                    if v is None:
                        new = intern(c)
                        v = ids[new] = len(states)
                        states.append(new)
            elif hash(nxt) not in seen:  # fingerprints (no edges are kept: no id needed)
                c = canon(nxt)
                h = hash(c)
                if h not in seen:
                    seen.add(h)
                    new = intern(c)
                    v = len(states)
                    states.append(h)
                    frontier[v] = new
            if new is not None:
                parent.append((u, step) if frontier is None else u)
                depth.append(depth[u] + 1)
                queue.append(v)
                for name, kind in checks.on_state(new, found):
                    found[name] = (kind, v)
                if len(states) > max_states:
                    raise BoundExceeded.of(max_states, scenario, release)
                if on_progress is not None and not len(states) % PROGRESS_EVERY:
                    on_progress({"states": len(states), "depth": depth[u],
                                 "frontier": len(queue),
                                 "seconds": time.perf_counter() - t0})
            edges += 1
            if ledges is not None:
                ledges.add(u, v, step, BY_NAME[step.action].own(ctx, s, step.rid))
            if graph is not None:
                if edge_events:
                    graph.add_edge(u, v, step=step, events=evs)
                else:
                    graph.add_edge(u, v, step=step)
    seconds = time.perf_counter() - t0

    verdicts = verdicts_of(ctx, props, applicable, found, states, parent, ledges,
                           canon if frontier is None else (lambda x: hash(canon(x))))
    return Exploration(release=release, scenario=scenario, verdicts=verdicts,
                       states=len(states), edges=edges, depth=max(depth), seconds=seconds,
                       complete=complete and not queue, graph=graph,
                       state_of=states if keep_graph or keep_states else None,
                       fired=frozenset(fired), emitted=frozenset(emitted))


def verdicts_of(ctx: Ctx, props: Sequence[Property], applicable, found, states, parent,
                ledges, canon) -> Dict[str, Verdict]:
    """Each property's verdict, with its shortest trace, from the first hits
    (``found``), the breadth-first parents and, for the graph properties,
    the recorded edges."""
    verdicts: Dict[str, Verdict] = {}
    for p in props:
        if p not in applicable:
            verdicts[p.name] = Verdict(p.name, p.kind, "not-applicable")
            continue
        if p.kind.on_graph:
            verdicts[p.name] = _graph_verdict(ctx, p, states, parent, ledges, canon)
            continue
        hit = found.get(p.name)
        if p.kind == Kind.SOMETIMES:
            if hit is None:
                verdicts[p.name] = Verdict(p.name, p.kind, "violated")
            else:
                verdicts[p.name] = Verdict(p.name, p.kind, "holds",
                                           _trace(ctx, p, hit, states, parent, canon))
        elif hit is None:
            verdicts[p.name] = Verdict(p.name, p.kind, "holds")
        else:
            verdicts[p.name] = Verdict(p.name, p.kind, "violated",
                                       _trace(ctx, p, hit, states, parent, canon))
    return verdicts


def _graph_verdict(ctx: Ctx, p: Property, states, parent, edges, canon) -> Verdict:
    """A liveness property on the whole explored graph (``engines.liveness``)."""
    if p.kind == Kind.ALWAYS_POSSIBLY:
        stuck = liveness.first_stuck(states, edges, p.goal, p.pending)
        if stuck is None:
            return Verdict(p.name, p.kind, "holds")
        trace = concretize(ctx, p, list(stuck.path), states, canon, None, "stuck")
        trace = attrs.evolve(trace, rid=stuck.rid, ends_by=liveness.ends_by(
            ctx, states, edges, stuck.path[-1], stuck.rid))
        return Verdict(p.name, p.kind, "violated", trace)
    if p.kind == Kind.BOUNDED:
        bad = liveness.first_unbounded(states, edges, p.goal, p.pending, liveness.armed_in(ctx))
        if bad is None:
            return Verdict(p.name, p.kind, "holds")
        trace = concretize(ctx, p, _path(bad[0], parent), states, canon, None, "stuck")
        return Verdict(p.name, p.kind, "violated", attrs.evolve(trace, rid=bad[1]))
    lasso = liveness.first_lasso(states, edges, p.pending)
    if lasso is None:
        return Verdict(p.name, p.kind, "holds")
    return Verdict(p.name, p.kind, "violated", _lasso_trace(ctx, p, lasso, states, parent, canon))


def _lasso_trace(ctx: Ctx, p: Property, lasso, states, parent, canon, rounds: int = 24) -> Trace:
    """The path to the cycle's entry, then the cycle, concretely: relabelled
    pages or ranks may bring the concrete state back only after a few turns
    of the canonical cycle, so it is walked until the concrete state repeats
    the entry exactly (the loop of an ITF lasso)."""
    prefix = concretize(ctx, p, list(lasso.path), states, canon, None, "lasso")
    cur = prefix.states[-1]
    steps, conc, evs = list(prefix.steps), list(prefix.states), list(prefix.events)
    loop = len(steps)
    for _ in range(rounds):
        for target in (states[v] for v in lasso.cycle):
            step, cur, ev = next((st, nxt, e) for st, nxt, e in successors(ctx, cur)
                                 if BY_NAME[st.action].own(ctx, cur, st.rid)
                                 and canon(nxt) == target)
            steps.append(step)
            conc.append(cur)
            evs.append(ev)
        if cur == conc[loop]:
            return attrs.evolve(prefix, steps=tuple(steps), states=tuple(conc),
                                events=tuple(evs), rid=lasso.rid, loop=loop)
    raise RuntimeError(f"the {p.name} cycle does not close in {rounds} turns")  # pragma: no cover


def _path(v: int, parent) -> List[int]:
    """The ids from the initial state to ``v``; ``parent`` holds (parent id,
    step) pairs, or the parent ids alone (fingerprints)."""
    out = []
    while v != -1:
        out.append(v)
        p = parent[v]
        v = p if isinstance(p, int) else p[0]
    return out[::-1]


def _trace(ctx: Ctx, prop: Property, hit, states, parent, canon) -> Trace:
    if hit[0] == "transition":
        path = _path(hit[1], parent)
    else:
        path = _path(hit[1], parent)
    return concretize(ctx, prop, path, states, canon,
                      final_step=hit[2] if hit[0] == "transition" else None,
                      violation=hit[0])


def concretize(ctx: Ctx, prop: Property, path: List[int], states, canon,
               final_step: Optional[Step], violation: str) -> Trace:
    """Turn a path of canonical state ids into concrete steps from the
    concrete initial state: at each state pick the enabled step whose
    successor has the next canonical form (one exists by symmetry)."""
    cur = initial_state(ctx.scenario)
    concrete = [cur]
    steps: List[Step] = []
    events: List[Tuple[Event, ...]] = []
    targets = [states[v] for v in path[1:]]
    if final_step is not None:
        targets.append(None)  # the violating transition, matched by the property
    for i, target in enumerate(targets):
        chosen = None
        for step, nxt, evs in successors(ctx, cur):
            if target is None:
                if not prop.holds_on(cur, step, evs, nxt):
                    chosen = (step, nxt, evs)
                    break
            elif canon(nxt) == target:
                chosen = (step, nxt, evs)
                break
        if chosen is None:  # pragma: no cover - a broken symmetry would land here
            raise RuntimeError(f"cannot concretize step {i} of the {prop.name} trace")
        step, cur, evs = chosen
        steps.append(step)
        concrete.append(cur)
        events.append(evs)
    return Trace(release=ctx.release.name, scenario=ctx.scenario.name, property=prop.name,
                 steps=tuple(steps), states=tuple(concrete), events=tuple(events),
                 violation=violation)


def replay(release: Release, scenario: Scenario, steps: Sequence[Step]):
    """Re-execute recorded steps; returns (states, events, first_disabled_index)."""
    ctx = Ctx(release=release, scenario=scenario)
    cur = initial_state(scenario)
    out_states = [cur]
    out_events = []
    for i, step in enumerate(steps):
        res = apply(ctx, cur, step)
        if res is None:
            return out_states, out_events, i
        cur, evs = res
        out_states.append(cur)
        out_events.append(evs)
    return out_states, out_events, None
