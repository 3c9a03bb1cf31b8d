"""Faults around requests: a prefill instance dies or goes silent to decode's
heartbeat, a transfer worker thread raises (``model.actions.faults``).  A dead instance's processes take no
step, what lived in them goes with them, decode's heartbeat fails exactly the
rooms ``_handle_node_failure`` fails, the trace checker reads a dead process
independently of the registry's gate, and scenarios without the events keep
their candidates (and so their sampled schedules)."""
import pytest

from reqmodel.engines import exhaustive
from reqmodel.model import processes, properties, releases, scenario
from reqmodel.model.actions import BY_NAME, Ctx, Step, apply, enabled, initial_state, successors
from reqmodel.model.actions.core import why_not
from reqmodel.model.state import KVPoll, MsgKind, State
from reqmodel.traces import order

# one prefill instance (shared transfer queues) serving both requests
_SHARED_DIES = {"name": "t", "prompt_pages": [2, 1], "prefill": {"pool_pages": 4},
                "decode": {"pool_pages": 2}, "events": {"prefill_dies": [1]}}


def _states(ctx):
    seen, todo = {initial_state(ctx.scenario)}, [initial_state(ctx.scenario)]
    while todo:
        s = todo.pop()
        for _, nxt, _ in successors(ctx, s):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("sc", [scenario.builtin("prefill-dies"), scenario.from_dict(_SHARED_DIES)],
                         ids=["per-request", "shared"])
def test_a_dead_instance_takes_no_step(sc):
    """Over every reachable state: no step of a prefill process is enabled on
    a request whose instance died, decode's heartbeat fails what it tracks,
    and nothing a dead prefill process held in flight (queued chunks, started
    writes) is left."""
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    states = _states(ctx)
    dead = [s for s in states if s.prefill_dead]
    assert dead and len(dead) < len(states)
    for s in dead:
        for a, r in enabled(ctx, s):
            if s.prefill_down(r):
                assert not processes.process_of(a.name).startswith("prefill."), (a.name, r)
                assert not any(m.rid == r and m.kind in (MsgKind.chunk, MsgKind.write,
                                                         MsgKind.stray) for m in s.net)
    # with shared queues the one instance's death is every request's
    shared = sc.transfer_queues == "shared"
    assert all(s.prefill_down(0) == s.prefill_down(1) for s in dead) == shared


def test_the_heartbeat_fails_each_tracked_room_not_at_success():
    """``_handle_node_failure``: every room of the instance with a receiver
    and a status other than Success turns Failed; a Success stays."""
    sc = scenario.from_dict(_SHARED_DIES)
    ctx = Ctx(release=releases.get("0.5.19"), scenario=sc)
    node = BY_NAME["d_node_failure"]
    seen = 0
    for s in _states(ctx):
        if not node.enabled(ctx, s, 0):
            assert not s.prefill_dead or s.prefill_lost or not any(
                d.has_receiver and t.status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput,
                                                KVPoll.Transferring)
                for d, t in zip(s.d, s.d_rooms))
            continue
        seen += 1
        nxt, _ = node.effect(ctx, s, 0)
        for d, before, after in zip(s.d, s.d_rooms, nxt.d_rooms):
            if d.has_receiver and before.status not in (None, KVPoll.Success):
                assert after.status == KVPoll.Failed
            else:
                assert after == before
        # the address leaves prefill_info_table: no second node failure
        assert nxt.prefill_lost == (-1,) and not node.enabled(ctx, nxt, 0)
    assert seen


@pytest.mark.parametrize("sc,fetch,status", [
    (scenario.builtin("prefill-silent"), "d_fetch_prefill_info", KVPoll.WaitingForInput),
    (scenario.from_dict(_SHARED_DIES), "d_fetch_fails", KVPoll.Failed)], ids=["live", "dead"])
def test_a_receiver_after_the_node_failure_waits_for_the_instance_info(sc, fetch, status):
    """A request reaching decode after the node failure gets a receiver that
    waits in pending_reqs (Bootstrapping: the instance is gone from
    prefill_info_table); the fetch of the instance's info registers a live
    instance again (the receiver inits, the heartbeat probes it again) and
    gives up on a dead one (the receiver is aborted, Failed)."""
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    lost = "d_heartbeat_lost" if fetch == "d_fetch_prefill_info" else "d_node_failure"
    steps = [Step("p_intake", 0), Step("d_intake", 0), Step("d_intake", 1), Step("d_door", 0)]
    if lost == "d_node_failure":
        steps.append(Step("p_dies", sc.events.prefill_dies[0]))
    steps += [Step(lost, 0), Step("d_door", 1)]
    s = initial_state(sc)
    for step in steps:
        got = apply(ctx, s, step)
        assert got is not None, (step, why_not(ctx, s, step))
        s = got[0]
    assert s.prefill_lost == (-1,)
    assert s.d[1].receiver_state is KVPoll.Bootstrapping and s.d_rooms[1].status is KVPoll.Bootstrapping
    assert not BY_NAME["d_prealloc"].enabled(ctx, s, 1)
    assert not BY_NAME[lost].enabled(ctx, s, 0)  # the heartbeat no longer probes it
    s, _ = apply(ctx, s, Step(fetch, 0))
    assert s.d_rooms[1].status is status
    assert (s.prefill_lost == ()) == (status is KVPoll.WaitingForInput)


def test_only_scenarios_with_the_event_have_the_steps():
    """d_node_failure follows from prefill_dies: a scenario without the event
    has none of the three steps among its candidates, so its searches and
    its sampled schedules are the ones it had before they were modelled."""
    for name in ("incident", "transfer-failure", "inflight-reuse"):
        ctx = Ctx(release=releases.get("0.5.23"), scenario=scenario.builtin(name))
        names = {a.name for a, _ in ctx.candidates}
        assert not names & {"p_dies", "d_node_failure", "d_heartbeat_lost",
                            "xfer_worker_raises"}, name
    ctx = Ctx(release=releases.get("0.5.23"), scenario=scenario.builtin("prefill-dies"))
    assert {"p_dies", "d_node_failure"} <= {a.name for a, _ in ctx.candidates}


def test_why_not_names_the_dead_instance():
    sc = scenario.from_dict(_SHARED_DIES)
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    s = initial_state(sc)
    for step in (Step("p_intake", 0), Step("p_dies", 1)):
        s, _ = apply(ctx, s, step)
    assert "has died" in why_not(ctx, s, Step("p_door", 0))
    assert "prefill.scheduler" in why_not(ctx, s, Step("p_door", 0))


def test_the_checker_finds_a_step_of_a_dead_process(monkeypatch):
    """Without the registry's gate (``State.prefill_down``) a dead instance's
    scheduler would go on; the trace checker reads the death off the state
    itself and names that step."""
    sc = scenario.from_dict(_SHARED_DIES)
    rel = releases.get("0.5.21")
    steps = [Step("p_intake", 0), Step("p_dies", 1), Step("p_door", 0)]
    assert exhaustive.replay(rel, sc, steps)[2] == 2  # the gate holds it
    monkeypatch.setattr(State, "prefill_down", lambda self, rid: False)
    bad = order.check(rel, sc, steps)
    assert [(v.step, v.due_since) for v in bad] == [(3, 2)]
    assert "died at step 2" in bad[0].text


def test_a_dead_instance_blocks_no_live_one_on_the_wire():
    """Each prefill instance has its own sockets: with per-request queues, a
    metadata message to the dead instance does not hold back the live one's
    (0.5.19 answers request 1 without a timeout when request 0's instance
    dies; the 0.5.21+ hold is the only wait, pinned in the verdict table)."""
    awt = properties.CATALOG["answered-without-timeout"]
    got = exhaustive.explore(releases.get("0.5.19"), scenario.builtin("prefill-dies"),
                             [awt]).verdicts[awt.name]
    assert got.verdict == "holds"


def test_a_scans_entries_are_compared_at_the_end_of_their_run():
    """The code's prealloc scan handles every entry of its queue in one call
    (the handshake fails both rooms a node failure failed); the model drops
    them one step each.  The trace judge compares such a run of one scan's
    entries at its end, and any other step at once."""
    from types import SimpleNamespace
    from reqmodel.conform import traces as tm
    steps = [Step("d_heartbeat_lost", 0), Step("d_prealloc_drop", 0), Step("d_prealloc_drop", 1)]
    loaded = SimpleNamespace(steps=steps, property=SimpleNamespace(name="x"),
                             scenario=scenario.builtin("prefill-silent"))
    model = [{"a": 0}, {"a": 1}, {"a": 2}, {"a": 3}]
    scans = [None, ("decode.scheduler", "prealloc"), ("decode.scheduler", "prealloc")]
    prep = tm.Prepared("t", loaded, releases.get("0.5.21"), model, {}, None, scans)

    def judged(observed):
        return tm.judge(prep, {"observations": observed, "stop": None, "final": {}})
    # the real scan already dropped r1 at step 2: agreed once the run ends
    assert judged([{"a": 0}, {"a": 1}, {"a": 9}, {"a": 3}]).divergence["why"] != "state"
    # ... but not when the run ends elsewhere
    assert judged([{"a": 0}, {"a": 1}, {"a": 9}, {"a": 8}]).divergence["step"] == 2
    # a step that is no scan's entry is compared at once
    assert judged([{"a": 0}, {"a": 7}, {"a": 2}, {"a": 3}]).divergence["step"] == 1


# --- a transfer worker thread raises out of its loop ------------------------

_PER_REQUEST_RAISE = {"name": "t", "prompt_pages": [1, 1], "prefill": {"pool_pages": 2},
                      "decode": {"pool_pages": 2}, "options": {"transfer_queues": "per-request"},
                      "events": {"transfer_worker_dies": [0]}}


@pytest.mark.parametrize("rel", ["0.5.19", "0.5.22"])
def test_a_dead_worker_reads_its_queue_no_more(rel):
    """Over every reachable state of transfer-worker-dies: once the worker's
    thread ended, no step takes a chunk from its queue (both requests' chunks
    are on it), the chunk it died on stays counted outstanding, and the room
    is poisoned exactly on the releases whose handler poisons it (0.5.22+)."""
    ctx = Ctx(release=releases.get(rel), scenario=scenario.builtin("transfer-worker-dies"))
    states = _states(ctx)
    dead = [s for s in states if s.workers_dead]
    assert dead and len(dead) < len(states)
    takes = {"xfer_dequeue", "xfer_session_failed", "xfer_fail", "xfer_worker_raises"}
    stuck = False
    for s in dead:
        assert s.workers_dead == ((-1, 0),)
        assert not {a.name for a, _ in enabled(ctx, s)} & takes
        assert s.rooms[s.room_index(0, 0)].outstanding == 1
        assert s.rooms[s.room_index(0, 0)].poisoned == ctx.release.poison_failed_rooms
        stuck = stuck or any(m.kind == MsgKind.chunk for m in s.net)
    assert stuck  # request 1's chunk queued behind the dead worker


def test_a_dead_worker_of_its_own_instance_holds_back_no_other():
    """With per-request queues each request has its own worker: request 0's
    dying leaves request 1 free to be answered without a timeout."""
    sc = scenario.from_dict(_PER_REQUEST_RAISE)
    ctx = Ctx(release=releases.get("0.5.21"), scenario=sc)
    dead = [s for s in _states(ctx) if s.workers_dead]
    assert {s.workers_dead for s in dead} == {((0, 0),)}
    assert any(s.d[1].answer == 200 for s in dead)
    assert not any(s.d[0].answer == 200 for s in dead)


def test_the_checker_finds_a_step_of_a_dead_worker(monkeypatch):
    """Without the queue's gate (``transfer._chunk_next`` reads
    ``State.workers_dead``) the dead worker would take request 1's chunk; the
    trace checker reads the thread's end off the state and names that step."""
    from reqmodel.model.actions import transfer
    sc = scenario.builtin("transfer-worker-dies")
    rel = releases.get("0.5.21")
    t = exhaustive.explore(rel, sc, [properties.CATALOG["answered-without-timeout"]])
    steps = list(t.verdicts["answered-without-timeout"].trace.steps)
    assert steps[-1].action == "xfer_worker_raises"
    steps.append(Step("xfer_dequeue", 1))
    assert exhaustive.replay(rel, sc, steps)[2] == len(steps) - 1  # the gate holds it
    assert "raised at an earlier step" in why_not(Ctx(release=rel, scenario=sc),
                                                  exhaustive.replay(rel, sc, steps)[0][-1],
                                                  steps[-1])
    monkeypatch.setattr(transfer, "worker_of", lambda c, r, q: (99, q))
    bad = order.check(rel, sc, steps)
    assert [(v.step, v.due_since) for v in bad] == [(len(steps), len(steps) - 1)]
    assert "thread ended" in bad[0].text
