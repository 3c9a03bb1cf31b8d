"""Model-generated conformance cases that are whole paths: for a step the
seams' one-call cases cannot stand for (it acts on what a KV manager's
threads left behind), every distinct state of a built-in scenario in which
the model takes that step, reached by its shortest path, is a case; the
trace rig (``conform/tracerig.py``) replays the path and the step on the
real code, and every step must agree with the model.

Used for Mooncake's failed-session list (``xfer_fail`` listing decode's
session, ``xfer_session_failed`` failing a chunk to a listed session,
``p_probe_failed_sessions`` taking it off) and for decode's heartbeat
declaring a prefill instance lost (``d_heartbeat_lost``, ``d_node_failure``:
the real ``_handle_node_failure``), and for a transfer worker that raises
(``xfer_worker_raises``: the real ``transfer_worker``'s handler, its thread
ending): ``tests/test_conformance_paths.py`` replays them on every release.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from reqmodel.engines.exhaustive import Trace
from reqmodel.model import scenario as scenario_mod
from reqmodel.model.actions import core
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import State

# the steps of the failed-session list, and the scenarios that take them
FAILED_LIST_STEPS = ("xfer_fail", "xfer_session_failed", "p_probe_failed_sessions")
FAILED_LIST_SCENARIOS = ("transfer-failure", "transfer-failure-probe", "room-reuse-three",
                         "prefill-tp-failure")


def paths_ending_in(release: Release, sc: Scenario, actions: Sequence[str],
                    per_action: Optional[int] = None, prop: str = "no-foreign-kv-read"
                    ) -> List[Trace]:
    """Traces of ``sc`` on ``release`` that end in one of ``actions``: each
    is the shortest path (breadth first, successors in the registry's
    order) to a state where the model takes such a step, then the step.
    Every distinct (state, step) is one, or with ``per_action`` that many
    of each action, spread evenly over the shortest-first order."""
    ctx = core.Ctx(release, sc)
    s0 = core.initial_state(sc)
    parent: Dict[State, Optional[Tuple[State, core.Step, tuple]]] = {s0: None}
    frontier = [s0]
    ends: Dict[str, List[Tuple[State, tuple]]] = {a: [] for a in actions}
    while frontier:
        nxt = []
        for s in frontier:
            for step, s2, evs in core.successors(ctx, s):
                if step.action in ends:
                    ends[step.action].append((s, (step, s2, evs)))
                if s2 not in parent:
                    parent[s2] = (s, step, evs)
                    nxt.append(s2)
        frontier = nxt
    out = []
    for action in actions:
        got = ends[action]
        if per_action is not None and len(got) > per_action:
            got = [got[i * len(got) // per_action] for i in range(per_action)]
        out += [_trace(release, sc, prop, parent, s, last, s0) for s, last in got]
    return out


def _trace(release, sc, prop, parent, s, last, s0) -> Trace:
    path = [last]
    back = s
    while parent[back] is not None:
        prev, st, ev = parent[back]
        path.append((st, back, ev))
        back = prev
    path.reverse()
    return Trace(release.name, sc.name, prop, tuple(x[0] for x in path),
                 (s0,) + tuple(x[1] for x in path), tuple(x[2] for x in path), "state")


def failed_list_cases(release: Release, per_action: Optional[int] = 20
                      ) -> Iterable[Tuple[Scenario, Trace]]:
    """The failed-session list's cases on ``release``: on each scenario, up
    to ``per_action`` of each of its steps."""
    for name in FAILED_LIST_SCENARIOS:
        sc = scenario_mod.builtin(name)
        for t in paths_ending_in(release, sc, FAILED_LIST_STEPS, per_action):
            yield sc, t


# decode's heartbeat declaring a prefill instance lost (``_handle_node_failure``)
# on a live instance and on a dead one, and the death itself; the rig drives
# one prefill instance, so the dead one's cases come from the scenario where
# it serves both requests (``prefill-dies`` has two instances)
NODE_FAILURE_STEPS = ("d_heartbeat_lost", "d_node_failure", "p_dies")


def node_failure_cases(release: Release, per_action: Optional[int] = 56
                       ) -> Iterable[Tuple[Scenario, Trace]]:
    """The node failure's cases on ``release``: up to ``per_action`` paths
    ending in the heartbeat's step on a live instance (``prefill-silent``)
    and on a dead one, and a fifth as many ending in the death itself."""
    silent = scenario_mod.builtin("prefill-silent")
    for t in paths_ending_in(release, silent, ("d_heartbeat_lost",), per_action):
        yield silent, t
    dies = scenario_mod.builtin("prefill-dies-alone")
    for t in paths_ending_in(release, dies, ("d_node_failure",), per_action):
        yield dies, t
    for t in paths_ending_in(release, dies, ("p_dies",), None if per_action is None
                             else max(1, per_action // 5)):
        yield dies, t


# a transfer worker raising out of its loop, with and without a client abort
WORKER_RAISE_SCENARIOS = ("transfer-worker-dies", "transfer-worker-dies-abort")


def worker_raise_cases(release: Release, per_scenario: Optional[int] = 60
                       ) -> Iterable[Tuple[Scenario, Trace]]:
    """The worker's raise on ``release``: up to ``per_scenario`` paths ending
    in ``xfer_worker_raises`` on each scenario of ``WORKER_RAISE_SCENARIOS``."""
    for name in WORKER_RAISE_SCENARIOS:
        sc = scenario_mod.builtin(name)
        for t in paths_ending_in(release, sc, ("xfer_worker_raises",), per_scenario):
            yield sc, t
