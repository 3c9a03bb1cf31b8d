"""A scan's poll latches its whole queue (notes/design.md, "A scan's poll
latches its whole queue"): ``pop_transferred``, ``pop_bootstrapped`` and
prefill's inflight scan poll every entry before handling any, and a poll
that reads Success or Failed latches it (``conclude_state``).  With two
samples of one n > 1 request on one room, the sample handed on second
reads its latch after the first one's ``clear()`` popped the room's entry."""
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply, enabled
from reqmodel.model.actions import decode as decode_mod
from reqmodel.model.actions import kvmanager
from reqmodel.model.actions.core import set_d
from reqmodel.model.actions.kvmanager import set_d_room
from reqmodel.model.state import DStage, KVPoll, PStage, replace
from steps import run_steps

SAMPLES = scenario.builtin("parallel-samples")
REL = releases.get("0.5.21")

# both samples preallocated (slots 0 and 1), prefill took sample 0's
# metadata only, sample 0's transfer wrote slot 0 and reported Success
BOTH_IN_TRANSFER = (
    Step("p_intake", 0), Step("p_intake", 1), Step("d_intake", 0), Step("d_intake", 1),
    Step("p_door", 0), Step("p_door", 1), Step("d_door", 0), Step("d_door", 1),
    Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0),
    Step("p_pop_bootstrapped", 0), Step("p_forward", 0), Step("p_result", 0),
    Step("xfer_dequeue", 0), Step("xfer_write", 0), Step("d_prealloc", 1, (0, (1,))),
    Step("d_recv_status", 0))


def _ctx():
    return Ctx(REL, SAMPLES)


def _names(ctx, s, r):
    return {a.name for a, rid in enabled(ctx, s) if rid == r}


def test_the_sibling_is_latched_by_the_commit_and_then_waits_for_good():
    ctx = _ctx()
    s = run_steps(ctx, BOTH_IN_TRANSFER)
    assert s.d[1].stage is DStage.TRANSFER and s.d[1].receiver_state is KVPoll.WaitingForInput
    s = apply(ctx, s, Step("d_transferred", 0))[0]
    assert s.d[0].stage is DStage.WAITING
    assert kvmanager.d_room_of(ctx, s, 1).status is None  # clear() popped the room
    assert s.d[1].receiver_state is KVPoll.Success
    # gated (its slot unwritten), no KeyError (latched), no waiting timeout
    assert decode_mod.transfer_poll(ctx, s, 1) is KVPoll.Transferring
    assert not {"d_transferred", "d_poll_popped_room", "d_waiting_timeout"} & _names(ctx, s, 1)


def test_without_the_latch_the_sibling_would_raise_instead(monkeypatch):
    """The same commit with a poll that latches nothing: the sibling reads
    the popped entry, which is the KeyError step (what the model said
    before the latch)."""
    ctx = _ctx()
    s = run_steps(ctx, BOTH_IN_TRANSFER)
    monkeypatch.setattr(decode_mod, "latch_transfer_queue", lambda c, s, but=-1: s)
    s = apply(ctx, s, Step("d_transferred", 0))[0]
    assert "d_poll_popped_room" in _names(ctx, s, 1)


def test_a_scan_whose_poll_raises_hands_nothing_on():
    """An unlatched entry whose room's entry is gone makes the whole
    ``pop_transferred`` raise: no other entry is committed in that call."""
    ctx = _ctx()
    s = run_steps(ctx, BOTH_IN_TRANSFER)
    assert "d_transferred" in _names(ctx, s, 0)
    popped = set_d_room(ctx, s, 1, status=None)
    assert kvmanager.transfer_poll_raises(ctx, popped)
    assert "d_transferred" not in _names(ctx, popped, 0)
    assert "d_poll_popped_room" in _names(ctx, popped, 0)


def test_a_scan_that_hands_nothing_on_still_latches_a_gated_success():
    """``d_transfer_poll``: the room reads Success for a sample whose slot
    is unwritten, another receiver of the room is live, and nothing is
    ready: the call latches and hands nothing on."""
    ctx = _ctx()
    s = run_steps(ctx, BOTH_IN_TRANSFER)
    s = _slot0_unwritten(s)  # sample 0 not ready either
    assert not {"d_transferred"} & (_names(ctx, s, 0) | _names(ctx, s, 1))
    assert "d_transfer_poll" in _names(ctx, s, 0)
    s2 = apply(ctx, s, Step("d_transfer_poll", 0))[0]
    assert s2.d[0].receiver_state is KVPoll.Success and s2.d[1].receiver_state is KVPoll.Success
    assert s2.d[0].stage is DStage.TRANSFER and s2.d[1].stage is DStage.TRANSFER


def _slot0_unwritten(s):
    """``s`` with slot 0 as prefill's aux write had not landed (room 0)."""
    slots = list(s.d_slots)
    slots[0] = replace(slots[0], room=0, covered_pages=0)
    return replace(s, d_slots=tuple(slots))


def test_a_single_user_room_takes_no_empty_latching_scan():
    """With no other receiver of the room the latch changes nothing a later
    poll would not read, and the model takes no such step."""
    ctx = _ctx()
    s = run_steps(ctx, BOTH_IN_TRANSFER)
    s = _slot0_unwritten(s)
    alone = set_d(s, 1, has_receiver=False, stage=DStage.GONE)
    assert "d_transfer_poll" not in _names(ctx, alone, 0)


def test_prefill_answers_the_sibling_on_the_success_its_scan_latched():
    """The inflight scan that answers sample 0 polls sample 1 too: it
    latches the room's Success (the sender's ``conclude_state``) before
    sample 0's ``clear()`` pops the entry, and is answered on it."""
    ctx = _ctx()
    steps = (Step("p_intake", 0), Step("p_intake", 1), Step("d_intake", 0), Step("d_intake", 1),
             Step("p_door", 0), Step("p_door", 1), Step("d_door", 0), Step("d_door", 1),
             Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0),
             Step("p_pop_bootstrapped", 0), Step("p_pop_bootstrapped", 1),
             Step("p_forward", 0), Step("p_forward", 1), Step("p_result", 0),
             Step("p_result", 1), Step("xfer_dequeue", 0), Step("xfer_write", 0))
    s = run_steps(ctx, steps)
    assert s.p[1].stage is PStage.INFLIGHT and s.p[1].concluded is None
    s = apply(ctx, s, Step("p_inflight", 0))[0]
    assert s.p[1].concluded is KVPoll.Success
    assert "p_poll_popped_room" not in _names(ctx, s, 1)
    s = apply(ctx, s, Step("p_inflight", 1))[0]
    assert s.p[1].stage is PStage.GONE and s.p[1].answer == 200


@pytest.mark.parametrize("release", releases.NAMES)
def test_n_2_samples_leave_one_waiting_for_good_on_every_release(release):
    """``every-wait-bounded`` fails on parallel-samples (two metadata
    buffers a worker) and holds on room-concurrent (one), where the second
    sample never reaches the transfer queue beside the first."""
    prop = properties.CATALOG["every-wait-bounded"]
    rel = releases.get(release)
    got = explore.explore(rel, SAMPLES, (prop,), stop_early=False, keep_graph=True)
    assert got.verdicts[prop.name].verdict == "violated"
    one = explore.explore(rel, scenario.builtin("room-concurrent"), (prop,),
                          stop_early=False, keep_graph=True)
    assert one.verdicts[prop.name].verdict == "holds"
