"""Concurrent users of one bootstrap_room (issue #23, ``room_users``), the
decode handshake's crash on a Success it has no branch for, and a crash
ending the run.

n > 1 sampling sends every sample with its prompt's room (tm 21:2038-2040),
so several requests of one room can be in flight at once; the model keys
prefill's and decode's room state by the room, so they meet there."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply, enabled, initial_state, successors
from reqmodel.model.scenario import ScenarioError, from_dict, to_dict
from reqmodel.model.actions.core import set_d
from reqmodel.model.actions.kvmanager import set_d_room
from reqmodel.model.state import ABORT_400, DStage, KVPoll
from steps import run_steps

CONCURRENT = scenario.builtin("room-concurrent")
SEQUENTIAL = attrs.evolve(CONCURRENT, name="room-sequential", room_users="sequential")
P = properties.CATALOG


def verdict(rel, sc, name):
    ex = explore.explore(rel, sc, (P[name],), stop_early=False, keep_graph=name in (
        "answered-without-timeout", "no-livelock"))
    v = ex.verdicts[name]
    return v.verdict, v.trace_length


def test_the_option_is_read_checked_and_written_back():
    assert CONCURRENT.room_users == "concurrent" and CONCURRENT.shares_rooms
    base = {"name": "x", "prompt_pages": [1, 1], "bootstrap_rooms": [1, 1],
            "prefill": {"pool_pages": 2}, "decode": {"pool_pages": 2}}
    assert from_dict(base).room_users == "sequential"
    with pytest.raises(ScenarioError, match='room_users must be "sequential" or "concurrent"'):
        from_dict({**base, "options": {"room_users": "parallel"}})
    with pytest.raises(ScenarioError, match="reuse_room_after applies only to room_users"):
        from_dict({**base, "options": {"room_users": "concurrent", "reuse_room_after": "both"}})
    again = from_dict(to_dict(CONCURRENT), origin="room-concurrent")
    assert again.room_users == "concurrent" and "reuse_room_after" not in to_dict(CONCURRENT)["options"]


def test_a_concurrent_user_is_sent_before_the_earlier_one_is_answered():
    ctx_c = Ctx(releases.get("0.5.21"), CONCURRENT)
    ctx_s = Ctx(releases.get("0.5.21"), SEQUENTIAL)
    s = initial_state(CONCURRENT)
    assert apply(ctx_c, s, Step("d_intake", 1)) is not None
    assert apply(ctx_s, s, Step("d_intake", 1)) is None


@pytest.mark.parametrize("name", ["no-scheduler-crash", "no-foreign-kv-read",
                                  "answered-without-timeout"])
def test_taking_turns_removes_what_concurrency_finds(name):
    """The same two requests, one after the other, crash nothing, read
    nothing foreign and leave nobody waiting."""
    rel = releases.get("0.5.21")
    assert verdict(rel, CONCURRENT, name)[0] == "violated"
    assert verdict(rel, SEQUENTIAL, name)[0] == "holds"


# r0 transferred and its Success on decode's request_status; r1's receiver
# is created on the room afterwards
AFTER_SUCCESS = (
    Step("p_intake", 0), Step("d_intake", 0), Step("d_intake", 1), Step("p_door", 0),
    Step("d_door", 0), Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0),
    Step("p_pop_bootstrapped", 0), Step("p_forward", 0), Step("p_result", 0),
    Step("xfer_dequeue", 0), Step("xfer_write", 0), Step("d_recv_status", 0))


@pytest.mark.parametrize("release", releases.NAMES)
def test_a_new_receiver_on_a_room_with_success_crashes_the_handshake(release):
    """update_status keeps the larger state, so the new receiver's first
    handshake poll reads Success: ValueError("Unexpected poll case")."""
    ctx = Ctx(releases.get(release), CONCURRENT)
    s = run_steps(ctx, AFTER_SUCCESS + (Step("d_door", 1),))
    assert s.d[1].receiver_state is KVPoll.Success
    assert apply(ctx, s, Step("d_prealloc", 1, (0, (1,)))) is None
    nxt, evs = apply(ctx, s, Step("d_unexpected_poll", 1))
    assert [e.kind for e in evs] == ["crash"] and evs[0].error == "ValueError"
    assert nxt.d[1].crashed and nxt.crashed()


def test_a_waiting_entry_is_polled_again_from_0_5_20_only():
    """An entry the handshake found waiting, whose room then reaches Success:
    0.5.19 skips the poll while every entry waits and preallocates it; 0.5.20+
    polls every entry and raises."""
    head = (Step("p_intake", 0), Step("d_intake", 0), Step("d_intake", 1), Step("p_door", 0),
            Step("d_door", 0), Step("d_door", 1), Step("d_prealloc", 0, (0, (0,))),
            Step("p_recv_metadata", 0), Step("p_pop_bootstrapped", 0), Step("p_forward", 0),
            Step("p_result", 0), Step("xfer_dequeue", 0), Step("xfer_write", 0),
            Step("d_recv_status", 0))
    two_slots = attrs.evolve(CONCURRENT, decode=attrs.evolve(CONCURRENT.decode,
                                                             metadata_buffers=2))
    old = Ctx(releases.get("0.5.19"), two_slots)
    s = run_steps(old, head)
    assert apply(old, s, Step("d_unexpected_poll", 1)) is None
    assert apply(old, s, Step("d_prealloc", 1, (0, (1,)))) is not None
    new = Ctx(releases.get("0.5.20"), two_slots)
    s = run_steps(new, head)
    assert apply(new, s, Step("d_unexpected_poll", 1)) is not None
    assert apply(new, s, Step("d_prealloc", 1, (0, (1,)))) is None


def test_nothing_moves_after_a_crash():
    """A scheduler that raised takes its server down: no step of either
    worker follows, and nobody counts as waiting for a timeout."""
    ctx = Ctx(releases.get("0.5.21"), CONCURRENT)
    s = run_steps(ctx, AFTER_SUCCESS + (Step("d_door", 1), Step("d_unexpected_poll", 1)))
    assert list(enabled(ctx, s)) == []
    assert not properties.waiting(s, 0) and properties.settled(s, 1)
    before = run_steps(ctx, AFTER_SUCCESS + (Step("d_door", 1),))
    assert list(enabled(ctx, before)) and properties.waiting(before, 1)


def test_an_assertion_in_release_kv_cache_ends_the_step_where_it_raises():
    """0.5.19 late-result-unit: release_kv_cache's assertion kills prefill in
    the middle of the inflight step, before the stream and the clear."""
    rel = releases.get("0.5.19")
    sc = scenario.builtin("late-result-unit")
    ex = explore.explore(rel, sc, (P["no-scheduler-crash"],), stop_early=False,
                         keep_graph=False)
    v = ex.verdicts["no-scheduler-crash"]
    assert v.verdict == "violated"
    kinds = [e.kind for e in v.trace.events[-1]]
    assert kinds[-1] == "crash" and "stream" not in kinds
    assert v.trace.states[-1].crashed()


# r0 is in decode's prealloc queue, its handshake done (request_status
# WaitingForInput); r1 has not reached decode
R0_WAITING = (Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0), Step("d_door", 0))


def test_nothing_is_dropped_when_the_handshake_raises():
    """pop_preallocated runs the handshake before the abort scan: an aborted
    entry whose poll reads Success takes the scheduler down; it is not
    dropped first (found by the decode_prealloc seam)."""
    ctx = Ctx(releases.get("0.5.20"), CONCURRENT)
    s = run_steps(ctx, AFTER_SUCCESS + (Step("d_door", 1),))
    aborted = set_d(s, 1, finished_reason=ABORT_400)
    assert apply(ctx, aborted, Step("d_prealloc_drop", 1)) is None
    assert apply(ctx, aborted, Step("d_unexpected_poll", 1)) is not None
    # without the Success the same entry is dropped
    quiet = set_d_room(ctx, set_d(aborted, 1, receiver_state=KVPoll.WaitingForInput), 1,
                       status=KVPoll.WaitingForInput)
    assert apply(ctx, quiet, Step("d_prealloc_drop", 1)) is not None


def test_a_popped_room_raises_in_the_first_handshake_after_the_door():
    """A new entry whose request_status entry another request popped: the
    door only queues it, so the next pop_preallocated's handshake polls it
    on every release (KeyError), 0.5.19 included (found by replaying the
    prefill-TP traces on 0.5.19's code, where the model had taken the first
    poll with the door)."""
    for name in ("0.5.19", "0.5.20", "0.5.23"):
        ctx = Ctx(releases.get(name), CONCURRENT)
        s = set_d_room(ctx, run_steps(ctx, R0_WAITING), 0, status=None)
        assert not s.d[0].waiting_for_input
        assert apply(ctx, s, Step("d_poll_popped_room", 0)) is not None, name
        assert apply(ctx, s, Step("d_prealloc", 0, (0, (0,)))) is None, name


def test_0_5_19_skips_the_poll_once_a_handshake_marked_every_entry():
    """0.5.19's handshake returns before polling while every entry is
    waiting_for_input and none concluded Failed (dc 19:871-880): once a
    scan has marked the entry, a popped room goes unnoticed there and the
    entry is preallocated; 0.5.20+ poll it and raise."""
    for name, raises in (("0.5.19", False), ("0.5.20", True), ("0.5.23", True)):
        ctx = Ctx(releases.get(name), CONCURRENT)
        s = set_d(run_steps(ctx, R0_WAITING), 0, waiting_for_input=True)
        s = set_d_room(ctx, s, 0, status=None)
        assert (apply(ctx, s, Step("d_poll_popped_room", 0)) is not None) is raises, name
        assert (apply(ctx, s, Step("d_prealloc", 0, (0, (0,)))) is None) is raises, name


def test_a_scan_that_admits_nothing_marks_the_waiting_entries_on_0_5_19_only():
    """d_handshake is the pop_preallocated whose handshake marks entries and
    which admits and drops none: with no page free it marks the waiting
    entry on 0.5.19; no such step on 0.5.20+, whose handshake always polls."""
    full = attrs.evolve(CONCURRENT, prompt_pages=(2, 1))
    for name, marks in (("0.5.19", True), ("0.5.21", False)):
        ctx = Ctx(releases.get(name), full)
        s = run_steps(ctx, R0_WAITING)
        taken = tuple(attrs.evolve(pg, owner=1) for pg in s.d_pages)
        s = attrs.evolve(s, d_pages=taken)  # every page held by another request
        step = Step("d_handshake", 0)
        got = apply(ctx, s, step)
        assert (got is not None) is marks, name
        if marks:
            after = got[0]
            assert after.d[0].waiting_for_input and after.d[0].stage is DStage.PREALLOC


def test_a_retracted_request_holds_back_the_prealloc_budget():
    """_allocatable_token_budgets(count_retracted=True) keeps a retracted
    request's pages out of the prealloc budget (found by the decode_prealloc
    seam): with two free pages and a one-page request retracted, a two-page
    request waits."""
    two = attrs.evolve(CONCURRENT, prompt_pages=(2, 1))
    ctx = Ctx(releases.get("0.5.21"), two)
    s = run_steps(ctx, R0_WAITING)
    assert apply(ctx, s, Step("d_prealloc", 0, (0, (0, 1)))) is not None
    retracted = set_d(s, 1, stage=DStage.RETRACTED, origin_pages=1)
    assert apply(ctx, retracted, Step("d_prealloc", 0, (0, (0, 1)))) is None


@pytest.mark.parametrize("release", ["0.5.19", "0.5.21", "0.5.23"])
def test_a_chunked_request_still_bootstrapping_crashes_on_another_users_success(release):
    """process_prefill_chunk calls check_bootstrap on the chunked request every
    iteration, and handle_pending_bootstrap raises on Transferring or Success
    (pf 19:1065-1066, 21:1226-1227, 23:1396-1397): a concurrent user of the
    room whose write concluded Success there kills the prefill scheduler
    while the optimistic chunked request is still bootstrapping."""
    sc = from_dict({"name": "t", "prompt_pages": [2, 1], "bootstrap_rooms": [1, 1],
                    "prefill": {"pool_pages": 3, "chunk_pages": 1}, "decode": {"pool_pages": 3},
                    "options": {"optimistic_prefill_attempts": 1, "room_users": "concurrent"}})
    ctx = Ctx(release=releases.get(release), scenario=sc)
    s0 = initial_state(sc)
    seen, todo, crashed = {s0}, [s0], []
    while todo and not crashed:
        s = todo.pop()
        for step, nxt, evs in successors(ctx, s):
            if step.action == "p_unexpected_poll" and s.p[step.rid].stage.name == "CHUNKED":
                crashed.append(evs)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert crashed and crashed[0][0].call == "handle_pending_bootstrap"
