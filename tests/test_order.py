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
from reqmodel.model.state import PStage
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
    assert processes.phase_of("p_unexpected_poll", PStage.BOOTSTRAP) == "bootstrap"
    assert processes.phase_of("p_unexpected_poll", PStage.INFLIGHT) == "inflight"
    assert processes.phase_of("xfer_write", PStage.INFLIGHT) is None


@pytest.mark.parametrize("release", releases.NAMES)
def test_no_corpus_trace_has_an_order_the_prefill_loop_forbids(release):
    paths = sorted((ROOT / release).glob("*.itf.json"))
    assert paths
    for path in paths:
        loaded = replay.load(path)
        assert order.check(loaded.release, loaded.scenario, loaded.steps) == [], path


def test_no_mutant_trace_has_an_order_the_prefill_loop_forbids():
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
