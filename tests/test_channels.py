"""The channels are the code's sockets and queues (issue #23): decode->prefill
messages are FIFO per (decode rank, prefill rank) and prefill->decode
reports and acks per (prefill rank, decode rank), whatever the room; a
prefill rank's chunks share one transfer queue and worker unless
``transfer_queues = "per-request"``; from 0.5.20 a cleared room's transfer
reports nothing.  Each test fails if the model goes back to per-room
channels or a report applied at the poll."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import actions, properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, initial_state
from reqmodel.model.actions.transport import next_d_to_p, p_to_d_heads
from reqmodel.model.scenario import ScenarioError, from_dict
from reqmodel.model.state import KVPoll, Msg, MsgKind
from steps import run_steps

TWO = {"name": "two", "prompt_pages": [1, 1], "prefill": {"pool_pages": 2},
       "decode": {"pool_pages": 2}}
READ = properties.CATALOG["no-foreign-kv-read"]




def _queued(ctx):
    """Both requests' chunks queued, request 0's first and dequeued."""
    steps = []
    for r, page in ((0, 0), (1, 1)):
        steps += [Step("p_intake", r), Step("d_intake", r), Step("p_door", r), Step("d_door", r)]
    for r, page in ((0, 0), (1, 1)):
        steps += [Step("d_prealloc", r, (0, (page,))), Step("p_recv_metadata", r),
                  Step("p_pop_bootstrapped", r), Step("p_forward", r), Step("p_result", r)]
    return run_steps(ctx, steps + [Step("xfer_dequeue", 0)])


@pytest.mark.parametrize("queues,second_waits", [("shared", True), ("per-request", False)])
def test_a_prefill_ranks_worker_takes_the_next_chunk_once_the_write_has_landed(
        queues, second_waits):
    sc = from_dict({**TWO, "options": {"transfer_queues": queues}})
    ctx = Ctx(releases.get("0.5.21"), sc)
    s = _queued(ctx)
    dequeue = actions.BY_NAME["xfer_dequeue"]
    assert dequeue.enabled(ctx, s, 1) is not second_waits
    s = run_steps(ctx, [Step("xfer_write", 0)], s)
    assert dequeue.enabled(ctx, s, 1)


def test_the_in_flight_reuse_read_needs_two_transfer_workers():
    """inflight-reuse's foreign read lands request 0's write after request
    1's own; one worker cannot (notes/verdicts.md, issue #23)."""
    per_request = scenario.builtin("inflight-reuse")
    shared = attrs.evolve(per_request, transfer_queues="shared")
    for name in ("0.5.19", "0.5.21"):
        rel = releases.get(name)
        assert explore.explore(rel, per_request, [READ]).verdicts[READ.name].verdict == "violated"
        assert explore.explore(rel, shared, [READ]).verdicts[READ.name].verdict == "holds"


@pytest.mark.parametrize("options,message", [
    ({"transfer_queues": "each"}, 'must be "shared" or "per-request"'),
    ({"transfer_queues": 1}, "transfer_queues"),
])
def test_a_bad_transfer_queues_option_is_refused(options, message):
    with pytest.raises(ScenarioError, match=message):
        from_dict({**TWO, "options": options})


def test_per_request_queues_need_what_separate_prefill_instances_have():
    with pytest.raises(ScenarioError, match="bootstrap_room per request"):
        from_dict({**TWO, "bootstrap_rooms": [1, 1], "options": {"transfer_queues": "per-request"}})
    with pytest.raises(ScenarioError, match="pool_pages of at least"):
        from_dict({**TWO, "prefill": {"pool_pages": 1},
                   "options": {"transfer_queues": "per-request"}})
    sc = from_dict({**TWO, "options": {"transfer_queues": "per-request"}})
    assert from_dict(sc.to_dict()) == sc
    assert "transfer_queues" not in from_dict(TWO).to_dict()["options"]  # old traces read as before


def test_decode_to_prefill_messages_keep_their_order_across_rooms():
    sc = from_dict(TWO)
    ctx = Ctx(releases.get("0.5.21"), sc)
    s = initial_state(sc)
    s = attrs.evolve(s, net=(Msg(MsgKind.abort, 0), Msg(MsgKind.metadata, 1, pages=(1,), slot=1)))
    assert next_d_to_p(ctx, s, 0) == Msg(MsgKind.abort, 0)
    assert next_d_to_p(ctx, s, 1) is None  # behind request 0's ABORT on the one socket


def test_an_ack_never_overtakes_the_report_its_rank_sent_before_it():
    sc = from_dict({**TWO, "decode": {"pool_pages": 2, "ranks": 2}})
    s = initial_state(sc)
    report = Msg(MsgKind.status, 0, poll=KVPoll.Success)
    ack0, ack1 = Msg(MsgKind.ack, 1, rank=0), Msg(MsgKind.ack, 1, rank=1)
    assert p_to_d_heads(attrs.evolve(s, net=(report, ack0, ack1))) == (report,)
    # acks to different decode ranks are on different sockets
    assert p_to_d_heads(attrs.evolve(s, net=(ack0, ack1, report))) == (ack0, ack1)
    assert p_to_d_heads(attrs.evolve(s, net=(ack0, ack0, ack1))) == (ack0, ack1)


@pytest.mark.parametrize("release,reported", [("0.5.19", True), ("0.5.20", False),
                                              ("0.5.23", False)])
def test_a_cleared_rooms_last_write_reports_only_on_0_5_19(release, reported):
    """conclude_transfer returns at once for a room the sender has cleared
    (cc 20:520-525); 0.5.19 updates and sends whatever the room."""
    sc = from_dict(TWO)
    ctx = Ctx(releases.get(release), sc)
    s = _queued(ctx)
    s = actions.kvmanager.set_room(ctx, s, 0, status=None)
    s = run_steps(ctx, [Step("xfer_write", 0)], s)
    assert bool(s.msgs("status", 0)) is reported
