"""``reqmodel guard check``: a proposal against its base, property by
property and scenario by scenario, and what it changes in waste."""
from __future__ import annotations

import pathlib
from typing import Dict, List, Optional, Sequence, Set, Tuple

import attrs
import networkx as nx

from reqmodel.traces import itf
from reqmodel.engines.base import safe_name
from reqmodel.engines.exhaustive import DEFAULT_MAX_STATES, explore
from reqmodel.model import events as ev
from reqmodel.model import clocks
from reqmodel.model.actions import ACTIONS
from reqmodel.model.properties import Property
from reqmodel.proposals.proposal import Proposal
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import DStage, PStage, State

# a property that applies on one side only (the proposal turns a mechanism
# off or on) is neither fixed nor broken by that: a violation that goes
# with its mechanism "no longer applies"; one that comes with it is broken
CHANGE = {("violated", "holds"): "fixed", ("holds", "violated"): "broken",
          ("violated", "violated"): "still-violated", ("holds", "holds"): "still-holds",
          ("violated", "n/a"): "no-longer-applies", ("holds", "n/a"): "no-longer-applies",
          ("n/a", "violated"): "broken", ("n/a", "holds"): "still-holds",
          ("n/a", "n/a"): "not-applicable",
          # the engine cannot decide the property (a liveness property without
          # the state graph): a violation that goes is not a fix...
          **{(a, b): "not-checked" for a in ("violated", "holds", "n/a", "not-checked")
             for b in ("violated", "holds", "n/a", "not-checked")
             if "not-checked" in (a, b)},
          # ... but one the proposal gains is: a deadlock it finds is a violation
          # of the whole property, where the base's search found none
          ("not-checked", "violated"): "broken"}

def timeout_seconds(release: Release, sc: Optional[Scenario] = None) -> Dict[str, float]:
    """Seconds each timeout action stands for on ``release``: its action
    names the environment variable, the release record its default, and a
    scenario's ``options.timeouts`` may set it (``clocks.seconds``)."""
    return {a.name: (release.timeout_seconds(a.timeout) if sc is None
                     else clocks.seconds(release, sc, a.timeout))
            for a in ACTIONS if a.timeout is not None}


def _norm(v: str) -> str:
    """A verdict as the change classification reads it (``CHANGE``).  Z3's bounded answers
    count as what they say within the depth: holds (safety) and not reached
    (reachability, as "violated", the way an unreachable good state is)."""
    return {"not-applicable": "n/a", "holds-to-depth": "holds",
            "unreached-to-depth": "violated"}.get(v, v)


def _verdicts(release: Release, sc: Scenario, props: Sequence[Property], engine):
    """Per property: (verdict, trace) from the chosen engine."""
    return {r.property: (str(r.verdict), r.trace) for r in engine.check(release, sc, props)}


@attrs.frozen
class Row:
    scenario: str
    property: str
    base_verdict: str
    proposal_verdict: str
    change: str
    trace_file: Optional[str]
    trace_length: Optional[int]

    def as_json(self) -> dict:
        return {"scenario": self.scenario, "property": self.property,
                "base_verdict": self.base_verdict, "proposal_verdict": self.proposal_verdict,
                "change": self.change, "trace_file": self.trace_file}


def compare(prop: Proposal, scenarios: Sequence[Scenario], props: Sequence[Property],
            out: pathlib.Path, engine=None, pending: Optional[list] = None) -> List[Row]:
    """Verdicts on base and proposal from ``engine`` (one of
    ``engines.base.ENGINES``; the exhaustive engine by default).
    Counterexample files are appended to ``pending`` as (path, trace,
    scenario) and written by :func:`write`, so a proposal that fails midway
    leaves nothing behind."""
    from reqmodel.engines.base import Exhaustive
    engine = Exhaustive() if engine is None else engine
    rows: List[Row] = []
    pending = [] if pending is None else pending
    for sc in scenarios:
        base = _verdicts(prop.base, sc, props, engine)
        psc = prop.apply(sc)
        mine = _verdicts(prop.release, psc, props, engine)
        for p in props:
            (bv, _), (mv, mtrace) = base[p.name], mine[p.name]
            change = CHANGE[(_norm(bv), _norm(mv))]
            path = None
            if mv == "violated" and mtrace is not None:
                path = out / f"{safe_name(p.name)}-{safe_name(sc.name)}.itf.json"
                meta = {"guards": prop.path, "base": prop.base.name, "engine": engine.name}
                if getattr(engine, "depth", None) is not None:
                    meta["depth"] = engine.depth
                pending.append((path, mtrace, psc, meta))
            rows.append(Row(sc.name, p.name, bv, mv, change,
                            None if path is None else str(path),
                            None if mtrace is None else len(mtrace)))
    return rows


def write(pending) -> None:
    for path, trace, sc, meta in pending:
        itf.write(path, trace, sc, engine="exhaustive", extra_meta=meta)


# ------------------------------------------------------------------ cost


def rejected_requests(sc: Scenario) -> Tuple[int, ...]:
    """Requests that some worker's intake rejects."""
    return tuple(r for r, n in enumerate(sc.prompt_pages)
                 if sc.prefill.rejects(n) or sc.decode.rejects(n))


def with_timeouts(sc: Scenario) -> Scenario:
    """Timeouts enabled for the intake-rejected requests: their waits are what
    cost measures, and a valid request's timeouts would only add noise."""
    targets = tuple(sorted(set(sc.events.timeouts) | set(rejected_requests(sc))))
    return attrs.evolve(sc, events=attrs.evolve(sc.events, timeouts=targets))


def _p_holds(s: State, r: int) -> bool:
    p = s.p[r]
    return p.stage not in (PStage.ABSENT, PStage.GONE, PStage.DOOR) or p.holds_kv or p.holds_metadata


def _d_holds(s: State, r: int) -> bool:
    d = s.d[r]
    return bool(d.pages) or d.meta_slot >= 0 or d.stage in (DStage.PREALLOC, DStage.TRANSFER, DStage.HELD)


def _ended(s: State, r: int) -> bool:
    return (s.p[r].stage is PStage.GONE and not s.p[r].results_due
            and s.d[r].stage is DStage.GONE)


def measure(release: Release, sc: Scenario, max_states: int = DEFAULT_MAX_STATES) -> dict:
    """Waste on one scenario (timeouts enabled for the rejected requests, so
    that every wait they cause can end):

    * ``rejected_acquires``: what a worker acquires for requests rejected at
      its own intake (sender, metadata, init, forward, kv, receiver, ...);
    * ``peer_acquires``: what a worker acquires for requests the *other*
      worker rejected;
    * ``peer_hold_seconds``: from the state where a worker starts holding a
      reservation for a request the other worker rejected, the timeout
      seconds that must pass before it can be released on the best schedule;
      the worst such start (None: some hold is never released);
    * ``timeout_only``: requests that, from some reachable state, can end
      only through a timeout.
    """
    scen = with_timeouts(sc)
    ex = explore(release, scen, [], max_states=max_states, stop_early=False, keep_graph=True,
                 edge_events=True)
    G, states = ex.graph, ex.state_of
    n = sc.n
    own: Dict[str, Set[str]] = {"prefill": set(), "decode": set()}
    peer: Dict[str, Set[str]] = {"prefill": set(), "decode": set()}
    for u, v, data in G.edges(data=True):
        s = states[u]
        for e in data["events"]:
            if not isinstance(e, (ev.Acquire, ev.Prealloc)):
                continue
            kind = e.resource if isinstance(e, ev.Acquire) else "prealloc"
            rejected_here = s.p[e.rid].rejected if e.side == "prefill" else s.d[e.rid].rejected
            rejected_there = s.d[e.rid].rejected if e.side == "prefill" else s.p[e.rid].rejected
            if rejected_here:
                own[e.side].add(kind)
            elif rejected_there:
                peer[e.side].add(kind)

    seconds = timeout_seconds(release, sc)

    def weight(u, v, data):
        return seconds.get(data["step"].action, 0)

    R = G.reverse(copy=False)
    hold_max: Optional[float] = 0.0
    timeout_only: List[int] = []
    free = nx.DiGraph((u, v) for u, v, d in G.edges(data=True)
                      if d["step"].action not in seconds)
    free.add_nodes_from(G.nodes)
    Rfree = free.reverse(copy=False)
    for r in range(n):
        # a reservation one worker keeps for a request the other rejected
        def holding(s):
            return (s.p[r].rejected and _d_holds(s, r)) or (s.d[r].rejected and _p_holds(s, r))
        held = [holding(s) for s in states]
        if not any(held):
            continue
        # where a hold begins: a holding state entered from a non-holding one
        entries = {v for u, v in G.edges if held[v] and not held[u]}
        if held[0]:
            entries.add(0)
        released = [i for i, h in enumerate(held) if not h]
        dist = nx.multi_source_dijkstra_path_length(R, released, weight=weight) if released else {}
        for i in entries:
            if i not in dist:
                hold_max = None
                break
            hold_max = max(hold_max, dist[i])
        if hold_max is None:
            break
    for r in range(n):
        ended = [i for i, s in enumerate(states) if _ended(s, r)]
        # states from which r can end at all, and without any timeout
        if _can_reach(R, ended) - _can_reach(Rfree, ended):
            timeout_only.append(r)
    return {
        "states": ex.states,
        "rejected_acquires": {k: sorted(v) for k, v in own.items()},
        "peer_acquires": {k: sorted(v) for k, v in peer.items()},
        "peer_hold_seconds": hold_max,
        "timeout_only": timeout_only,
    }


def _can_reach(R: nx.DiGraph, targets) -> Set[int]:
    """Nodes with a path to some target, walking the reversed graph ``R``."""
    seen = set(targets)
    stack = list(targets)
    while stack:
        u = stack.pop()
        for v in R.successors(u):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def cost(prop: Proposal, scenarios: Sequence[Scenario], max_states: int = DEFAULT_MAX_STATES) -> dict:
    out = {}
    for sc in scenarios:
        if not rejected_requests(sc):
            continue
        out[sc.name] = {"base": measure(prop.base, sc, max_states),
                        "proposal": measure(prop.release, prop.apply(sc), max_states)}
    return out
