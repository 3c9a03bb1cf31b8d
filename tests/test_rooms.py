"""bootstrap_room reuse (issue #3): state keyed by the room, not the request.

These tests pin the mechanisms the room-reuse verdicts rest on, so that a
rule that stopped being read (the generation check, the late-status drop,
the enqueue filter, the free-slot choice) fails here and not only as a moved
cell in the verdict table.
"""

import pathlib

import attrs
import pytest

from reqmodel.model import actions
from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.model.actions import Ctx, Step, apply, initial_state
from reqmodel.model.scenario import ScenarioError, from_dict
from reqmodel.model.state import KVPoll, Msg, PStage
from reqmodel.model.ackpolicy import PER_ENDPOINT
from steps import run_steps

ROOM_REUSE = scenario.builtin("room-reuse")
ACK = properties.CATALOG["ack-belongs-to-its-hold"]


def verdict(rel, sc, prop):
    ex = explore.explore(rel, sc, (prop,), stop_early=False, keep_graph=False)
    v = ex.verdicts[prop.name]
    return v.verdict, v.trace_length


def test_rooms_are_keyed_by_their_first_user():
    sc = from_dict({"name": "r", "prompt_pages": [1, 1, 1], "bootstrap_rooms": [7, 3, 7],
                    "prefill": {"pool_pages": 2}, "decode": {"pool_pages": 2}})
    assert [sc.room_slot(r) for r in range(3)] == [0, 1, 0]
    assert [sc.room_id(r) for r in range(3)] == [1, 2, 1]
    assert sc.room_sharers(2) == (0, 2) and sc.previous_user(2) == 0
    assert sc.previous_user(0) is None and sc.shares_rooms
    # request 2 is its own symmetry class: it is not interchangeable with 0
    classes = explore.symmetry_classes(sc)
    assert classes[0] != classes[2]
    plain = scenario.builtin("incident")
    assert not plain.shares_rooms and plain.room_slot(1) == 1


@pytest.mark.parametrize("rooms,message", [
    ("[1]", "bootstrap_rooms has 1 entries for 2 requests"),
    ("[0, 1]", "bootstrap_rooms must be a list of positive integers"),
    ('"a"', "bootstrap_rooms must be a list of positive integers"),
])
def test_bad_bootstrap_rooms_are_refused_in_one_line(rooms, message):
    import tomllib
    data = tomllib.loads(f"name = 'x'\nprompt_pages = [1, 1]\nbootstrap_rooms = {rooms}\n"
                         "[prefill]\npool_pages = 1\n[decode]\npool_pages = 1\n")
    with pytest.raises(ScenarioError, match=message):
        from_dict(data)


def test_bad_reuse_option_is_refused():
    with pytest.raises(ScenarioError, match='reuse_room_after must be "both" or "decode"'):
        from_dict({"name": "x", "prompt_pages": [1], "prefill": {"pool_pages": 1},
                   "decode": {"pool_pages": 1}, "options": {"reuse_room_after": "never"}})




def test_the_later_request_waits_for_the_earlier_answers():
    ctx = Ctx(releases.get("0.5.23"), ROOM_REUSE)
    s = initial_state(ROOM_REUSE)
    assert apply(ctx, s, Step("p_intake", 1)) is None
    assert apply(ctx, s, Step("d_intake", 1)) is None
    early = attrs.evolve(ROOM_REUSE, reuse_room_after="decode")
    s = run_steps(Ctx(releases.get("0.5.23"), early),
                  [Step("d_intake", 0), Step("d_door", 0), Step("d_abort", 0),
                   Step("d_prealloc_drop", 0)])
    assert s.d[0].answer == 500
    assert apply(Ctx(releases.get("0.5.23"), early), s, Step("d_intake", 1)) is not None
    assert apply(ctx, s, Step("d_intake", 1)) is None  # "both": prefill has not answered


# room-reuse with one decode page: the later request can take the page only
# once the earlier request's hold has ended
ONE_PAGE = attrs.evolve(ROOM_REUSE, name="room-reuse-one-page",
                        decode=attrs.evolve(ROOM_REUSE.decode, pool_pages=1))


def test_a_stale_ack_counts_for_the_later_request_until_generations():
    """The 14-step counterexample's mechanism on 0.5.21, and the same
    release with 0.5.22's generation-tagged acks and per-endpoint targets."""
    rel = releases.get("0.5.21")
    assert verdict(rel, ONE_PAGE, ACK) == ("violated", 14)
    tagged = attrs.evolve(rel, ack_generations=True, ack_targets=PER_ENDPOINT)
    assert verdict(tagged, ONE_PAGE, ACK)[0] == "holds"
    assert verdict(releases.get("0.5.22"), ONE_PAGE, ACK)[0] == "holds"


def test_an_ack_sent_before_a_queued_chunk_frees_the_page_it_lands_in():
    """The worker counts a chunk as outstanding from its dequeue, so prefill
    acks the drain of an aborted room while its chunk is still queued.  The
    ack ends the earlier request's hold, the later request takes the one page
    and re-creates the room, and the chunk lands in that page: every release.
    (The model counted queued chunks too until issue #3's fifth part, and
    found no read on this variant.)"""
    read = properties.CATALOG["no-foreign-kv-read"]
    for name in releases.NAMES:
        assert verdict(releases.get(name), ONE_PAGE, read) == ("violated", 23)
    ex = explore.explore(releases.get("0.5.22"), ONE_PAGE, [read])
    steps = [(s.action, s.rid) for s in ex.verdicts[read.name].trace.steps]
    # the earlier request's hold ends on the ack, the later request takes the
    # page, and only then is the earlier request's chunk dequeued
    assert steps.index(("d_recv_ack", 0)) < steps.index(("d_prealloc", 1)) \
        < steps.index(("xfer_dequeue", 0)) < steps.index(("d_attend", 1))


def test_a_failed_poll_clears_the_room_so_the_later_request_gets_in():
    """Decode's request_status[room] is the room's.  ``pop_transferred``'s
    ``failure_exception()`` clears it at the Failed poll, before any hold
    (dc 22:2764; read on the real queue by the decode-commit conformance
    seam), so a later request of the room creates a fresh entry while the
    earlier request is held.  Its abort re-arms the room's tracker, its
    drain ack frees the earlier hold (is_abort_release_safe(room), cc
    22:879-883), and the earlier request's ``_do_release`` clear() pops the
    entry the later receiver polls (KeyError).  Until issue #24 the model
    cleared only at the release, and the later receiver inherited Failed."""
    popped = properties.CATALOG["no-poll-of-popped-room"]
    r22 = releases.get("0.5.22")
    assert verdict(r22, ROOM_REUSE, ACK) == ("violated", 18)
    ex = explore.explore(r22, ROOM_REUSE, [popped])
    steps = [(s.action, s.rid) for s in ex.verdicts[popped.name].trace.steps]
    assert len(steps) == 14 and steps[-1] == ("d_poll_popped_room", 1)
    assert (steps.index(("d_transferred", 0)) < steps.index(("d_door", 1))
            < steps.index(("d_recv_ack", 0)))


def test_the_earlier_clear_pops_the_later_receivers_status_on_0_5_19():
    """0.5.19, deferral on: request 0 is held, request 1's receiver replaces
    the Failed entry, request 0's drain ack releases it and its clear() pops
    the entry; request 1's first handshake poll, in the prealloc scan after
    its door, raises KeyError in the scheduler (14 steps, as on 0.5.20+: the
    door does not poll, so 0.5.19's skip of a waiting queue does not cover a
    new entry; found by replaying the prefill-TP traces on 0.5.19's code)."""
    popped = properties.CATALOG["no-poll-of-popped-room"]
    ex = explore.explore(releases.get("0.5.19"), ROOM_REUSE, [popped])
    steps = [(s.action, s.rid) for s in ex.verdicts[popped.name].trace.steps]
    assert len(steps) == 14 and steps[-1] == ("d_poll_popped_room", 1)
    assert steps.index(("d_door", 1)) < steps.index(("d_recv_ack", 0))
    assert steps[-2:] == [("d_recv_ack", 0), ("d_poll_popped_room", 1)]
    assert ("d_prealloc", 1) not in steps


def test_a_late_status_is_dropped_only_while_no_receiver_has_the_room():
    ctx = Ctx(releases.get("0.5.22"), ROOM_REUSE)
    s = initial_state(ROOM_REUSE)
    s = actions.transport.send(s, Msg("status", 0, poll=KVPoll.Success))
    s = attrs.evolve(s, p=(attrs.evolve(s.p[0], answer=200, stage=PStage.GONE),) + s.p[1:],
                     d=(attrs.evolve(s.d[0], answer=500),) + s.d[1:])
    drop = actions.BY_NAME["d_drop_late_status"]
    assert drop.enabled(ctx, s, 0)
    s = run_steps(ctx, [Step("d_intake", 1), Step("d_door", 1)], s)
    assert s.d[1].has_receiver and not drop.enabled(ctx, s, 0)
    # decode's thread now counts request 0's Success for the room request 1 tracks
    assert s.room_msgs("status", 1) == (Msg("status", 0, poll=KVPoll.Success),)
    assert actions.BY_NAME["d_recv_status"].enabled(ctx, s, 0)


def test_no_chunk_is_queued_for_a_failed_room():
    """``add_transfer_request`` drops a chunk for a room that is unknown or
    Failed: prefill's abort before the last chunk queues nothing."""
    sc = scenario.builtin("inflight-reuse")
    ctx = Ctx(releases.get("0.5.23"), sc)
    s = run_steps(ctx, [Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0),
                        Step("d_door", 0), Step("d_prealloc", 0, (0, (0,))),
                        Step("p_recv_metadata", 0), Step("p_pop_bootstrapped", 0),
                        Step("p_forward", 0), Step("d_abort", 0), Step("p_recv_abort", 0)])
    assert s.rooms[0].status == KVPoll.Failed
    s = run_steps(ctx, [Step("p_result", 0)], s)
    assert s.p[0].sent == 1 and not s.msgs("chunk", 0)


def test_a_dirty_free_metadata_slot_is_a_choice():
    sc = scenario.builtin("room-reuse")
    s = initial_state(sc)
    slots = (attrs.evolve(s.d_slots[0], room=1), s.d_slots[1])
    s = attrs.evolve(s, d_slots=slots)
    assert actions.decode.slot_choices(s) == (0, 1)
    clean = initial_state(sc)
    assert actions.decode.slot_choices(clean) == (0,)


def test_a_third_request_of_the_room_polls_what_a_drain_ack_popped_from_0_5_21():
    """Found by the Hypothesis engine on a drawn five-request scenario and
    reproduced with three (notes/verdicts.md, "Larger scenarios"): request
    0's transfer fails and decode holds its page (deferred release), request
    2 took the room after request 1 was failed by request 0's late ABORT,
    and request 0's drain ack pops the request_status entry request 2 polls.
    Since issue #24 (a Failed poll clears the entry at once, before the
    hold) request 1 already gets in, and the same release pops its entry:
    18 steps instead of 24."""
    sc = scenario.builtin("room-reuse-three")
    popped = properties.CATALOG["no-poll-of-popped-room"]
    for name in releases.NAMES:
        expected = ("holds", None) if name in ("0.5.19", "0.5.20") else ("violated", 18)
        assert verdict(releases.get(name), sc, popped) == expected, name
    # deferred release is what keeps request 0's receiver alive until the ack
    off = attrs.evolve(sc, deferred_release=False)
    assert verdict(releases.get("0.5.22"), off, popped) == ("holds", None)
    # and from 0.5.21 decode holds a failure it never sent ABORT for
    # (ensure_abort_notified(force_arm=True), dc 21:2692): that field alone
    # opens and closes it
    r20, r21 = releases.get("0.5.20"), releases.get("0.5.21")
    assert verdict(attrs.evolve(r21, hold_unnotified=False), sc, popped) == ("holds", None)
    assert verdict(attrs.evolve(r20, deferred_release_default=True, hold_unnotified=True),
                   sc, popped) == ("violated", 18)


def test_a_transfer_failure_is_the_named_requests_own():
    """``transfer_failure = [0]`` lets request 0's transfers fail, and a
    transfer fails only for a chunk (mc 19:1719-1736: the worker takes the
    chunk and finds decode's session failed; or the batch of a write in
    flight fails): not before prefill has queued one.  The dequeue-time
    failure consumes the chunk.  Once request 0 has answered and the next
    request of its room has reached a worker, the room's chunks are that
    request's, and nothing fails under request 0's name."""
    ctx = Ctx(releases.get("0.5.21"), scenario.builtin("room-reuse-three"))
    fail = actions.BY_NAME["xfer_fail"]
    s = run_steps(ctx, [
        Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0), Step("d_door", 0),
        Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0),
        Step("p_pop_bootstrapped", 0), Step("p_forward", 0)])
    # decode's metadata is there, prefill has queued nothing: no failure yet
    assert s.rooms[0].status == KVPoll.WaitingForInput and not s.msgs("chunk", 0)
    assert not fail.enabled(ctx, s, 0)
    s = run_steps(ctx, [Step("p_result", 0)], s)
    assert fail.enabled(ctx, s, 0)  # request 0's own chunk, at the head of the queue
    s = run_steps(ctx, [Step("xfer_fail", 0)], s)
    # taken off the queue, nothing written, the room Failed and finished
    assert s.rooms[0].status == KVPoll.Failed and not s.msgs("chunk", 0)
    assert not s.msgs("write", 0) and not s.msgs("stray", 0) and s.rooms[0].outstanding == 0
    s = run_steps(ctx, [
        Step("p_inflight", 0), Step("d_recv_status", 0), Step("d_transferred", 0),
        Step("p_intake", 1), Step("d_intake", 1), Step("p_recv_abort", 0), Step("p_door", 1),
        Step("d_recv_ack", 0), Step("d_door", 1), Step("d_prealloc", 1, (0, (0,))),
        Step("p_recv_metadata", 1), Step("p_pop_bootstrapped", 1), Step("p_forward", 1),
        Step("p_result", 1)], s)
    # the room takes request 1's chunk now: no failure under request 0's name;
    # request 0's failure listed decode's session as failed (mc 19:1869-1874),
    # so request 1's chunk fails early (mc 19:1722-1736), under its own name
    assert s.rooms[0].status == KVPoll.WaitingForInput and s.msgs("chunk", 1)
    assert not fail.enabled(ctx, s, 0)
    assert s.failed_sessions == ((-1, 0, 0),)
    assert not actions.BY_NAME["xfer_dequeue"].enabled(ctx, s, 1)
    s = run_steps(ctx, [Step("xfer_session_failed", 1)], s)
    assert s.rooms[0].status == KVPoll.Failed and not s.msgs("write", 1)
    assert not fail.enabled(ctx, s, 0)


def test_a_client_abort_opens_the_popped_room_on_every_release_that_defers():
    """The same crash with the client's abort of request 0 instead of a
    transfer failure (notes/examples/room-reuse-three-abort.toml, found on a
    drawn six-request scenario): decode sent ABORT, so every release holds
    the page when it defers the release, and the hold's clear() on the drain
    ack pops the entry request 2's receiver created. With each release's
    default (deferral on from 0.5.21) 0.5.21+ crash; forced on, every
    release does; off, none does.  Since issue #24 (the failed poll clears
    the entry before the hold) request 1 already gets in, in 14 steps
    (0.5.20+ took 21 steps through request 2 before; 0.5.19 took 15 until its
    first handshake after the door polled the new receiver, as the code
    does)."""
    sc = scenario.load_file(str(pathlib.Path(__file__).parent.parent
                                / "notes/examples/room-reuse-three-abort.toml"))
    popped = properties.CATALOG["no-poll-of-popped-room"]
    for name in releases.NAMES:
        rel = releases.get(name)
        default = ("holds", None) if name in ("0.5.19", "0.5.20") else ("violated", 14)
        assert verdict(rel, sc, popped) == default, name
        # the first handshake after the door polls the new receiver and
        # raises, 0.5.19 included
        forced = ("violated", 14)
        assert verdict(rel, attrs.evolve(sc, deferred_release=True), popped) == forced, name
        assert verdict(rel, attrs.evolve(sc, deferred_release=False), popped) == ("holds", None), name
