"""Is every step of a trace one its process could take at that point of its
loop?  A check of a trace against ``model.processes``, independent of how the
model enforces the same order.

The model enforces the prefill loop's order through a history variable and
a guard (``model.actions.intake``).  This module re-derives it from the
trace alone: it replays the steps, builds the happens-before relation of
the run (vector clocks over the processes of ``model.processes``: each
process's own order, a message from the step that put it in flight to the
step that took it, a worker's threads through the request they both touch,
and the client, who sends the next user of a room only after the answers
it waits for), and then checks the loop's rule:

    if prefill's inflight scan became due for a request at step ``e``, and
    the prefill loop takes in a request at step ``j`` that happens after
    ``e``, the loop ran its inflight scan on that request between the two
    (``processes.PREFILL_LOOP.scan_before_intake``; the loop comes back
    from that scan to its intake without blocking, so nothing that needed
    another process can arrive in between).

the rule of a dead process (a step of a prefill process after its
instance died, ``p_dies``, or of a transfer worker on its queue after the
worker's thread raised, ``xfer_worker_raises``, is none the code takes), and the rule of a loop
that returns in the middle of an iteration
(``Loop.returns_early``):

    a step of a phase the loop skips while a condition holds (decode's
    every phase after ingest while its engine is paused, its prealloc and
    transfer scans while a request waits in the retracted queue) is not
    taken in a state where it holds.

The second rule reads the conditions from the state (``processes.
CONDITIONS``) and the phases from ``processes``' data, on the trace alone;
the registry gates the same actions on the same data
(``actions.core._loop_gated``), and a test lifts that gate to show the
checker catches what it would let through.

A step that breaks either is one the code's loop order forbids.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import attrs

from reqmodel.model import processes
from reqmodel.model.actions import Ctx, Step
from reqmodel.model.actions.transport import prank_of
from reqmodel.model.events import Stream
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import State
from reqmodel.traces.render import net_changes


@attrs.frozen
class OrderViolation:
    step: int  # 1-based index of the step the loop could not take there
    # 1-based index of the step after which the scan was due, or the
    # condition held (the step itself for a condition held since the start)
    due_since: int
    request: int  # the request the scan was due for, or the step's own
    text: str


def _instance(step: Step) -> str:
    proc = processes.process_of(step.action)
    if proc in ("prefill.transfer_worker", "prefill.probe_thread"):  # one per prefill rank
        q = step.arg[0] if step.arg else 0
        return f"{proc}[{q}]"
    return proc


def _worker(proc: str) -> str:
    return proc.split(".", 1)[0]


def happens_before(ctx: Ctx, states: Sequence, events: Sequence, steps: Sequence[Step]
                   ) -> List[Dict[str, int]]:
    """One vector clock per step (``clock[j][p]``: the last step of process
    ``p`` that happens before or is step ``j``, 1-based; 0: none)."""
    sc = ctx.scenario
    clocks: List[Dict[str, int]] = []
    last_of: Dict[str, int] = {}  # process instance -> its last step
    sent_by: Dict[object, List[int]] = {}  # message -> steps that put a copy in flight
    touched: Dict[Tuple[str, int], int] = {}  # (worker, request) -> last step
    answered_at: Dict[int, List[int]] = {}  # request -> steps that streamed an answer
    listed = 0  # the last step that changed a failed-session list (under its lock)

    def join(a: Dict[str, int], b: Dict[str, int]) -> None:
        for k, v in b.items():
            if a.get(k, 0) < v:
                a[k] = v

    for j, step in enumerate(steps, start=1):
        proc = _instance(step)
        clock: Dict[str, int] = {}
        if proc in last_of:
            join(clock, clocks[last_of[proc] - 1])
        added, gone = net_changes(states[j - 1], states[j])
        # messages taken by this step
        for m in gone:
            senders = sent_by.get(m)
            if senders:
                join(clock, clocks[senders.pop(0) - 1])
        # the worker's other threads, through the request they share
        w = _worker(proc)
        if (w, step.rid) in touched:
            join(clock, clocks[touched[(w, step.rid)] - 1])
        # a failed-session list: the steps that change it, and the early
        # exit that reads it, follow its last change
        changes_list = states[j - 1].failed_sessions != states[j].failed_sessions
        if listed and (changes_list or step.action == "xfer_session_failed"):
            join(clock, clocks[listed - 1])
        # the client sends the next user of a room after the answers it waits for
        if step.action in ("p_intake", "d_intake"):
            prev = sc.previous_user(step.rid)
            if prev is not None and sc.room_users != "concurrent":
                for a in answered_at.get(prev, ()):
                    join(clock, clocks[a - 1])
        clock[proc] = j
        clocks.append(clock)
        last_of[proc] = j
        touched[(w, step.rid)] = j
        if changes_list:
            listed = j
        for m in added:
            sent_by.setdefault(m, []).append(j)
        for ev in events[j - 1]:
            if isinstance(ev, Stream):
                answered_at.setdefault(ev.rid, []).append(j)
    return clocks


def check(release: Release, scenario: Scenario, steps: Sequence[Step]
          ) -> List[OrderViolation]:
    """The steps of ``steps`` that a scheduler loop's order forbids (empty:
    none).  ``steps`` must replay (``engines.exhaustive.replay``)."""
    from reqmodel.engines.exhaustive import replay
    from reqmodel.model.actions.intake import inflight_scan_due

    ctx = Ctx(release=release, scenario=scenario)
    states, events, bad = replay(release, scenario, steps)
    if bad is not None:
        raise ValueError(f"step {bad + 1} ({steps[bad]}) does not replay")
    clocks = happens_before(ctx, states, events, steps)
    loop = processes.PREFILL_LOOP
    found: List[OrderViolation] = []
    inflight_first = "inflight" in loop.scan_before_intake
    due_since: Dict[int, Optional[int]] = {r: None for r in range(scenario.n)}
    found.extend(_early_returns(states, steps))
    found.extend(_dead_steps(states, steps))
    found.extend(_dead_worker_steps(states, steps))
    for j, step in enumerate(steps, start=1):
        phase = processes.phase_of(step.action, states[j - 1], step.rid)
        if phase == "ingest" and processes.loop_of(step.action) is loop:
            for r0, e in due_since.items():
                if e is not None and r0 != step.rid and clocks[j - 1].get(
                        _instance(steps[e - 1]), 0) >= e:
                    found.append(OrderViolation(
                        j, e, r0,
                        f"step {j} {step}: the prefill loop takes in a request that was sent "
                        f"after step {e} ({steps[e - 1]}), which made its inflight scan due "
                        f"for r{r0}; the loop runs that scan before it comes back to its "
                        f"intake ({', '.join(loop.scan_before_intake)} -> ingest)"))
        after = states[j]
        for r in range(scenario.n):
            due = inflight_first and inflight_scan_due(ctx, after, r)
            if not due:
                due_since[r] = None
            elif due_since[r] is None or (phase == "inflight" and step.rid == r):
                due_since[r] = j
    return sorted(found, key=lambda v: v.step)


def _early_returns(states: Sequence[State], steps: Sequence[Step]) -> List[OrderViolation]:
    found: List[OrderViolation] = []
    held_since: Dict[str, int] = {}
    for j, step in enumerate(steps, start=1):
        before = states[j - 1]
        loop = processes.loop_of(step.action)
        phase = processes.phase_of(step.action, before, step.rid)
        for cond, fn in processes.CONDITIONS.items():
            if not fn(before):
                held_since.pop(cond, None)
                continue
            since = held_since.setdefault(cond, max(j - 1, 1))
            skipped = dict(loop.returns_early).get(cond, ()) if loop else ()
            if phase in skipped:
                found.append(OrderViolation(
                    j, since, step.rid,
                    f"step {j} {step}: the {loop.name} loop's {phase} phase runs "
                    f"while {processes.WHILE[cond]} (since step {since}); the loop skips "
                    f"{', '.join(skipped)} then"))
    return found


def _dead_steps(states: Sequence[State], steps: Sequence[Step]) -> List[OrderViolation]:
    """Steps of a prefill process whose instance had died (``p_dies``): a
    dead process takes no step."""
    found: List[OrderViolation] = []
    died: Dict[int, int] = {}  # request -> the step after which its instance was dead
    for j, step in enumerate(steps, start=1):
        before = states[j - 1]
        for r in range(len(before.p)):
            # read off the state itself, not through the gate the registry
            # uses (``State.prefill_down``): -1 is every request's instance
            if -1 in before.prefill_dead or r in before.prefill_dead:
                died.setdefault(r, j - 1)
        if processes.process_of(step.action).startswith("prefill.") and step.rid in died:
            found.append(OrderViolation(
                j, died[step.rid], step.rid,
                f"step {j} {step}: a step of {processes.process_of(step.action)}, whose "
                f"prefill instance died at step {died[step.rid]}"))
    return found


def _dead_worker_steps(states: Sequence[State], steps: Sequence[Step]) -> List[OrderViolation]:
    """Steps of a transfer worker whose thread had ended (``xfer_worker_raises``),
    read off the state: the worker of request r on prefill rank q is
    (-1, q) with shared queues, (r, q) with per-request ones."""
    found: List[OrderViolation] = []
    died: Dict[Tuple[int, int], int] = {}  # (request, rank) -> the step after which it ended
    for j, step in enumerate(steps, start=1):
        before = states[j - 1]
        for inst, q in before.workers_dead:
            for r in (range(len(before.p)) if inst < 0 else (inst,)):
                died.setdefault((r, q), j - 1)
        if (processes.process_of(step.action) == "prefill.transfer_worker"
                and step.action not in processes.NIC_STEPS):
            key = (step.rid, prank_of(step.arg))
            if key in died:
                found.append(OrderViolation(
                    j, died[key], step.rid,
                    f"step {j} {step}: a step of the transfer worker of r{step.rid} on prefill "
                    f"rank {key[1]}, whose thread ended at step {died[key]}"))
    return found
