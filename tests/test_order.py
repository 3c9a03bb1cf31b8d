"""The processes' order: every action is some process's step, the prefill
loop's data covers every release, and no trace of the corpus has a step
order the prefill loop forbids (``traces.order``, checked independently of
the guard that enforces it in the model)."""
import pathlib

import pytest

from reqmodel.engines import exhaustive
from reqmodel.model import processes, properties, releases, scenario
from reqmodel.model.actions import ACTIONS, Ctx, initial_state, successors
from reqmodel.model.actions import intake
from reqmodel.model.actions.core import set_d, set_p
from reqmodel.model.state import DStage, PStage
from reqmodel.traces import order, replay

ROOT = pathlib.Path(__file__).parent.parent / "counterexamples"


def test_every_action_is_a_step_of_one_process():
    assert sorted(a.name for a in ACTIONS) == sorted(processes.known())


def test_the_prefill_loop_is_cited_on_every_release():
    lines = dict(processes.PREFILL_LOOP.lines)
    assert set(lines) == set(releases.NAMES)
    for rel, cited in lines.items():
        for phase in processes.PREFILL_LOOP.phases + ("paused",):
            assert cited[phase].startswith("pf "), (rel, phase)


def test_the_inflight_scan_is_the_one_before_intake():
    assert processes.actions_of_phase("inflight") == (
        "p_inflight", "p_poll_popped_room", "p_unexpected_poll")
    s = initial_state(scenario.builtin("room-reuse"))
    assert processes.phase_of("p_unexpected_poll", set_p(s, 0, stage=PStage.BOOTSTRAP), 0) \
        == "bootstrap"
    assert processes.phase_of("p_unexpected_poll", set_p(s, 0, stage=PStage.INFLIGHT), 0) \
        == "inflight"
    assert processes.phase_of("xfer_write", s, 0) is None


def test_the_decode_loop_is_cited_on_every_release():
    loop = processes.DECODE_LOOP
    lines = dict(loop.lines)
    assert set(lines) == set(releases.NAMES)
    for rel, cited in lines.items():
        for key in loop.phases + loop.skips + tuple(c for c, _ in loop.returns_early):
            assert cited[key].startswith("dc "), (rel, key)


def test_the_decode_loop_skips_its_scans_while_a_request_waits_retracted():
    """Every action of the prealloc and transfer phases, the waiting timeout
    included (the receiver's poll notices it), is a phase the retracted
    queue's early return skips; the door of a retracted request is part of
    retract_decode's call (batch), a new request's is ingest."""
    loop = processes.DECODE_LOOP
    skipped = dict(loop.returns_early)["retracted_queue"]
    assert skipped == ("prealloc", "transfer")
    assert set(processes.actions_of_phase("transfer", loop)) == {
        "d_transferred", "d_transfer_poll", "d_poll_popped_room", "d_waiting_timeout"}
    assert "d_prealloc_splits" in processes.actions_of_phase("prealloc", loop)
    s = initial_state(scenario.builtin("room-reuse"))
    assert processes.phase_of("d_door", set_d(s, 0, stage=DStage.DOOR, door_flag="retracted"),
                              0) == "batch"
    assert processes.phase_of("d_door", set_d(s, 0, stage=DStage.DOOR), 0) == "ingest"


@pytest.mark.parametrize("release", releases.NAMES)
def test_no_corpus_trace_has_an_order_a_loop_forbids(release):
    paths = sorted((ROOT / release).glob("*.itf.json"))
    assert paths
    for path in paths:
        loaded = replay.load(path)
        assert order.check(loaded.release, loaded.scenario, loaded.steps) == [], path


def test_no_mutant_trace_has_an_order_a_loop_forbids():
    for path in sorted((ROOT / "mutants").glob("*/*.itf.json")):
        loaded = replay.load(path)
        assert order.check(loaded.release, loaded.scenario, loaded.steps) == [], path


def _crash(release):
    sc = scenario.builtin("room-reuse-early")
    prop = properties.CATALOG["no-scheduler-crash"]
    return exhaustive.explore(releases.get(release), sc, [prop]).verdicts[prop.name], sc


def test_the_checker_finds_the_order_without_the_loop_guard(monkeypatch):
    """Lift the model's guard: the prefill scheduler's crash on a reused room
    (the earlier user's Success read by the next user's sender) comes back,
    and the checker names the intake the loop's order forbids."""
    assert _crash("0.5.21")[0].verdict == "holds"
    monkeypatch.setattr(intake, "_ingest_after_inflight_scan", lambda c, s, r: True)
    v, sc = _crash("0.5.21")
    assert v.verdict == "violated"
    found = order.check(releases.get("0.5.21"), sc, v.trace.steps)
    assert found and v.trace.steps[found[0].step - 1].action == "p_intake"
    assert v.trace.steps[found[0].due_since - 1].action == "xfer_write"
    assert found[0].request == 0


def test_the_guard_keeps_an_intake_sent_before_the_scan_was_due():
    """Decode answers request 0 (the client's abort) before its transfer
    concludes: the client may send request 1 before prefill's inflight scan
    is due for request 0, so prefill may take it in while the scan is due."""
    sc = scenario.from_dict({
        "name": "t", "prompt_pages": [1, 1], "bootstrap_rooms": [1, 1],
        "prefill": {"pool_pages": 2}, "decode": {"pool_pages": 2},
        "options": {"reuse_room_after": "decode", "client_abort_reaches": "decode"},
        "events": {"client_abort": [0]}})
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    seen, todo, found = set(), [initial_state(sc)], False
    while todo and not found:
        s = todo.pop()
        for step, nxt, _ in successors(ctx, s):
            if (step.action == "p_intake" and step.rid == 1
                    and intake.inflight_scan_due(ctx, s, 0)):
                assert not s.p[0].scan_due_when_answered
                found = True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert found


def _path_to(parent, s, last):
    """The steps from the initial state to ``last``, taken in ``s``."""
    steps = [last]
    while parent[s] is not None:
        s, step = parent[s]
        steps.append(step)
    return steps[::-1]


_RETRACT_TIMEOUT = {"name": "t", "prompt_pages": [1, 1], "prefill": {"pool_pages": 2},
                    "decode": {"pool_pages": 2}, "events": {"retract": [0], "timeouts": [1]}}


def _skipped_while_retracted(ctx, stop_at_first, cond="retracted_queue"):
    """(the state, the step) pairs of a search where a step of a phase the
    decode loop skips is taken while ``cond`` holds (a request waits
    retracted, by default)."""
    skipped = dict(processes.DECODE_LOOP.returns_early)[cond]
    holds = processes.CONDITIONS[cond]
    s0 = initial_state(ctx.scenario)
    seen, todo, parent, found = {s0}, [s0], {s0: None}, []
    while todo and not (found and stop_at_first):
        s = todo.pop()
        waits = holds(s)
        for step, nxt, _ in successors(ctx, s):
            if (waits and processes.loop_of(step.action) is processes.DECODE_LOOP
                    and processes.phase_of(step.action, s, step.rid) in skipped):
                found.append((s, step))
            if nxt not in seen:
                seen.add(nxt)
                parent[nxt] = (s, step)
                todo.append(nxt)
    return found, parent


def test_no_step_the_retracted_queue_skips_is_enabled_while_it_waits():
    """Over every state of a request retracted while another waits for its
    transfer (with its timeouts): no prealloc or transfer step, the waiting
    timeout included, is enabled while the retracted queue is not empty."""
    sc = scenario.from_dict(_RETRACT_TIMEOUT)
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    assert _skipped_while_retracted(ctx, stop_at_first=False)[0] == []


def test_the_checker_finds_a_scan_step_taken_while_a_request_waits_retracted(monkeypatch):
    """Without the registry's loop gate (the one place that holds the
    return: no guard repeats it) a step of a scan the loop skips fires while
    a request waits retracted; the checker names that step and its phase."""
    monkeypatch.setattr(processes, "skipped_phases", lambda loop, s: frozenset())
    sc = scenario.from_dict(_RETRACT_TIMEOUT)
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    found, parent = _skipped_while_retracted(ctx, stop_at_first=True)
    assert found
    steps = _path_to(parent, *found[0])
    last = steps[-1].action
    phase = processes.loop_gate(last)[1]
    assert phase in ("prealloc", "transfer")
    # the checker reads the conditions itself, not the registry's gate
    assert order.check(releases.get("0.5.21"), sc, steps[:-1]) == []
    bad = order.check(releases.get("0.5.21"), sc, steps)
    assert [(v.step, steps[v.step - 1].action) for v in bad] == [(len(steps), last)]
    assert f"{phase} phase" in bad[0].text and "waits in the retracted queue" in bad[0].text


_PAUSE_TWO = {"name": "t", "prompt_pages": [1, 1], "prefill": {"pool_pages": 2},
              "decode": {"pool_pages": 2, "overlap_schedule": False},
              "events": {"preempt": [0, 1]}}


def test_a_pause_retracts_every_running_request_and_the_loop_waits_for_continue():
    """pause_generation(mode="retract") takes the whole running batch, and
    until continue_generation re-adds them the decode loop runs no phase
    after ingest: over every state, no such step is enabled while a request
    is held for rebootstrap, and every pause step leaves no request running."""
    sc = scenario.from_dict(_PAUSE_TWO)
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    assert _skipped_while_retracted(ctx, stop_at_first=False, cond="paused")[0] == []
    s0 = initial_state(sc)
    seen, todo, both = {s0}, [s0], 0
    while todo:
        s = todo.pop()
        for step, nxt, _ in successors(ctx, s):
            if step.action == "d_pause_retract":
                running = [k for k in range(2) if s.d[k].stage is DStage.RUNNING]
                assert step.rid == running[0]
                assert not any(d.stage is DStage.RUNNING for d in nxt.d)
                both += len(running) == 2
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert both


def test_the_checker_finds_a_step_of_a_paused_decode_loop(monkeypatch):
    """Lift the registry's loop gate: a decode step after ingest comes while a
    request is held for rebootstrap, and the checker names it and the pause."""
    monkeypatch.setattr(processes, "skipped_phases", lambda loop, s: frozenset())
    sc = scenario.from_dict(_PAUSE_TWO)
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    found, parent = _skipped_while_retracted(ctx, stop_at_first=True, cond="paused")
    assert found
    steps = _path_to(parent, *found[0])
    bad = order.check(releases.get("0.5.21"), sc, steps)
    assert bad and bad[-1].step == len(steps) and "the paused is not empty" not in bad[-1].text
    assert "while the engine is paused" in bad[-1].text
