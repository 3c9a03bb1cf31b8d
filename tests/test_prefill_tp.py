"""Prefill TP > 1 (issue #3): one sender, KV manager and transfer worker per
prefill rank; decode counts the ranks' Success reports and drain acks.

These tests pin the mechanisms the prefill-tp verdicts rest on, so that a
rule that stopped being read (the response count, the per-rank ack count,
the MIN-reduced prefill poll, the page slices) fails here and not only as a
moved cell in the verdict table.
"""
import json

import attrs
import pytest

from reqmodel.model import actions
from reqmodel.engines import exhaustive as explore
from reqmodel.traces import itf
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.model.events import Commit
from reqmodel.model.actions import Ctx, Step, initial_state
from reqmodel.model.scenario import ScenarioError, from_dict
from reqmodel.model.state import DStage, KVPoll, Msg, Page
from steps import run_steps

PREFILL_TP = scenario.builtin("prefill-tp")
FAILURE = scenario.builtin("prefill-tp-failure")
ONE = from_dict({"name": "one-request-two-prefill-ranks", "prompt_pages": [1],
                 "prefill": {"pool_pages": 1, "ranks": 2}, "decode": {"pool_pages": 1},
                 "options": {"deferred_release": True}, "events": {"client_abort": True}})
COMPLETES = properties.CATALOG["valid-request-completes"]
ACK_RELEASE = properties.CATALOG["drain-ack-releases-hold"]
COMMIT = properties.CATALOG["commit-after-all-ranks"]
READ = properties.CATALOG["no-foreign-kv-read"]


def trace(rel, sc, prop):
    ex = explore.explore(rel, sc, (prop,))
    return ex.verdicts[prop.name]




@pytest.mark.parametrize("release", releases.NAMES)
def test_decode_commits_only_once_every_prefill_rank_reported(release):
    """The shortest completion takes both ranks' writes, both reports applied
    by decode's thread as they arrive, and one D3 poll: after the first
    report the room counts one rank and is not Success."""
    v = trace(releases.get(release), ONE, COMPLETES)
    assert v.verdict == "holds"  # a reachability property holds once reached
    steps = v.trace.steps
    writes = [s.arg for s in steps if s.action == "xfer_write"]
    assert sorted(writes) == [(0,), (1,)]
    reports = [i for i, s in enumerate(steps) if s.action == "d_recv_status"]
    assert sorted(steps[i].arg for i in reports) == [(0,), (1,)]
    first = v.trace.states[reports[0] + 1]
    assert len(first.d_rooms[0].responded) == 1
    assert first.d_rooms[0].status == KVPoll.WaitingForInput
    polls = [i for i, s in enumerate(steps) if s.action == "d_transferred"]
    assert len(polls) == 1 and polls[0] > reports[1]
    assert v.trace.states[polls[0] + 1].d[0].stage is DStage.WAITING


def test_a_prefill_ranks_reports_and_acks_arrive_in_the_order_sent():
    """One socket per (prefill rank, decode endpoint) carries both, across
    rooms: an ack waits for every older message of its prefill rank to its
    decode rank, and a report (sent to every decode rank) for every older
    message of its prefill rank."""
    from reqmodel.model.actions.transport import p_to_d_heads
    from reqmodel.model.state import MsgKind
    s = initial_state(PREFILL_TP)
    status0 = Msg(MsgKind.status, 0, poll=KVPoll.Success, prank=1)
    ack0 = Msg(MsgKind.ack, 0, rank=0, prank=1)
    status1 = Msg(MsgKind.status, 1, poll=KVPoll.Success, prank=0)
    s = attrs.evolve(s, net=(status0, ack0, status1))
    assert p_to_d_heads(s) == (status0, status1)  # rank 0's channel is not behind rank 1's
    s = attrs.evolve(s, net=(ack0, status0))
    assert p_to_d_heads(s) == (ack0,)


def test_the_prefill_scheduler_sees_the_least_of_its_ranks_polls():
    ctx = Ctx(releases.get("0.5.21"), ONE)
    s = run_steps(ctx, [Step("p_intake", 0), Step("p_door", 0)])
    room0 = actions.kvmanager.room_of(ctx, s, 0, 0)
    s = actions.kvmanager.set_room(ctx, s, 0, q=0, status=KVPoll.WaitingForInput)
    assert actions.kvmanager.sender_poll(ctx, s, 0) == KVPoll.Bootstrapping  # rank 1 still bootstrapping
    s = actions.kvmanager.set_room(ctx, s, 0, q=1, status=KVPoll.Failed)
    assert actions.kvmanager.sender_poll(ctx, s, 0) == KVPoll.Failed
    assert room0.status == KVPoll.Bootstrapping


@pytest.mark.parametrize("release", releases.NAMES)
def test_a_hold_ends_only_on_a_drain_ack_from_every_prefill_rank(release):
    """``is_abort_release_safe(room, len(bootstrap_infos))``: one ack per
    prefill rank the receiver bootstrapped from."""
    v = trace(releases.get(release), ONE, ACK_RELEASE)
    assert v.verdict == "holds"  # a reachability property holds once reached
    acks = [(i, s.arg) for i, s in enumerate(v.trace.steps) if s.action == "d_recv_ack"]
    assert sorted(a for _, a in acks) == [(0, 0), (0, 1)]
    after_first = v.trace.states[acks[0][0] + 1]
    assert after_first.d[0].stage is DStage.HELD


def test_a_one_rank_ack_count_would_free_the_hold_early():
    """The count is what the property rests on: a decode that needs one ack
    only (is_abort_release_safe(room, 1)) frees the page while the other
    prefill rank's write can still land in it."""
    ctx = Ctx(releases.get("0.5.21"), ONE)
    s = initial_state(ONE)
    s = attrs.evolve(s, d=(attrs.evolve(s.d[0], stage=DStage.HELD, held=(0,), pages=(0,)),))
    tracker = attrs.evolve(s.d_rooms[0], armed=((0, 0, 0),), acked=((0, 1, 0),))
    s2, evs = actions.drelease.resolve_held(ctx, s, 0, tracker)
    assert s2.d[0].stage is DStage.HELD and not evs
    both = attrs.evolve(tracker, acked=((0, 0, 0), (0, 1, 0)))
    s3, _ = actions.drelease.resolve_held(ctx, s, 0, both)
    assert s3.d[0].stage is DStage.GONE


def test_each_prefill_rank_writes_its_own_slice():
    page = Page(owner=1, writer=None, slice_writers=(None,))
    half = page.with_slice(1, 1)
    assert half.writers == (None, 1) and not half.foreign_to(1) and not half.written_by(1)
    stale = Page(owner=1, writer=1, slice_writers=(0,))
    assert stale.foreign_to(1) and not stale.written_by(1)
    assert stale.with_slice(1, 1).written_by(1)


def test_the_scenario_refuses_prefill_and_decode_ranks_both_above_one():
    data = {"name": "x", "prompt_pages": [1], "prefill": {"pool_pages": 1, "ranks": 2},
            "decode": {"pool_pages": 1, "ranks": 2}}
    with pytest.raises(ScenarioError, match="cannot both be above 1"):
        from_dict(data)
    data["decode"]["ranks"] = 1
    data["prefill"]["ranks"] = 3
    with pytest.raises(ScenarioError, match=r"\[prefill\] ranks must be 1..2"):
        from_dict(data)


def test_one_rank_traces_keep_their_shape_and_two_rank_traces_name_the_rank():
    """Fields that only several prefill ranks use are left out at their
    default, so one-rank trace files read as before."""
    rel = releases.get("0.5.19")
    probe = scenario.builtin("transfer-failure-probe")
    one = itf.to_itf(trace(rel, probe, READ).trace, probe)
    text = json.dumps(one)
    assert '"prank"' not in text and '"slice_writers"' not in text
    two = itf.to_itf(trace(rel, FAILURE, properties.CATALOG["no-reuse-during-inflight-write"]
                           ).trace, FAILURE)
    text = json.dumps(two)
    assert '"prank"' in text and '"slice_writers"' in text
    assert two["#meta"]["scenario_config"]["prefill"]["ranks"] == 2


def _mixed_commit(pre, step, evs, post):
    """False on a commit that counted the request's own report from one
    prefill rank and an earlier request's from another."""
    for e in evs:
        if isinstance(e, Commit):
            origins = {o for _, o in e.counted}
            if e.rid in origins and len(origins) > 1:
                return False
    return True


@pytest.mark.parametrize("release", releases.NAMES)
def test_a_stale_report_completes_the_later_requests_response_count(release):
    """prefill_response_tracker[room] is a set of prefill ranks, not of
    (request, rank), so a commit can count request 1's own rank-0 Success and
    request 0's rank-1 Success, with rank 1's heads of the page never written
    for request 1.  The aux room check passes: request 1's own rank 0 wrote
    it.  A report of request 0's sent before request 1 reused the room cannot
    be that report: it reaches decode before the drain ack behind it on the
    same socket, and the ack is what frees the page for request 1.  What
    remains is a report written after request 1 re-opened the room on
    prefill (``conclude_transfer`` sends nothing for a cleared room from
    0.5.20): request 0's chunk still queued on that rank when the ABORT found
    nothing dequeued and acked at once (mc 21:2110-2116: counted at dequeue),
    dequeued after request 1's metadata re-created the room, so it writes
    request 0's heads into request 1's page; or, on 0.5.20, which frees an
    un-notified page without waiting for acks, request 0's write in flight
    landing once request 1's sender has re-created the room."""
    prop = properties.Property(name="no-mixed-commit", kind="always", ref="test", text="",
                               transition=_mixed_commit)
    ex = explore.explore(releases.get(release), PREFILL_TP, [prop])
    v = ex.verdicts[prop.name]
    assert v.verdict == "violated"
    steps = v.trace.steps
    last = steps[-1]
    assert last.action == "d_transferred" and last.rid == 1
    commit = next(e for e in v.trace.events[-1] if isinstance(e, Commit))
    (q, _), = [x for x in commit.counted if x[1] == 0]  # the stale rank
    stale_write = max(i for i, s in enumerate(steps)
                      if s.action == "xfer_write" and s.rid == 0 and s.arg == (q,))
    reopened = steps.index(actions.Step("p_door", 1))
    acks = [i for i, s in enumerate(steps) if s.action == "d_recv_ack" and s.arg == (0, q)]
    assert reopened < stale_write and all(i < stale_write for i in acks)
    pre = v.trace.states[-2]
    slot = pre.d_slots[pre.d[1].meta_slot]
    assert slot.room == PREFILL_TP.room_id(1)  # the commit check passes
    assert not COMMIT.holds_on(v.trace.states[-2], last, v.trace.events[-1], v.trace.states[-1])
