"""Decode's ranks deciding alone: each rank's own pool after a hold that the
ranks release at different times, and the admission that then splits them.

Up to 0.5.22 each decode rank releases a failed transfer's hold on its own
(on its own drain ack, or, up to 0.5.20, holds only if it sent ABORT
itself); ``pop_preallocated`` on each rank admits from that rank's own
allocators.  0.5.23 agrees on the hold and reduces the release decision, so
the ranks' pools stay one.  These tests flip the release record's fields one
at a time and read the verdict of ``ranks-stay-in-step`` and the trace that
breaks it.
"""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.engines.symmetry import permute_ranks
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import Ctx, enabled
from reqmodel.model.events import RanksSplit
from reqmodel.model.scenario import from_dict
from reqmodel.model.state import DecodeReq, DStage, Page, State

STEP = properties.CATALOG["ranks-stay-in-step"]
ADMISSION = scenario.builtin("rank-admission")


def verdict(rel, sc):
    # breadth-first: the first violation found is a shortest one
    ex = explore.explore(rel, sc, (STEP,), stop_early=True, keep_graph=False)
    v = ex.verdicts[STEP.name]
    return v.verdict, v.trace_length, v.trace


# the built-in scenario is the client's abort alone (only a drain ack ends
# a hold); with timeouts too, a rank's own clock can split the ranks first
ABORT_ONLY = ADMISSION
WITH_TIMEOUTS = attrs.evolve(ADMISSION, name="rank-admission-timeouts",
                             events=attrs.evolve(ADMISSION.events, timeouts=(0,)))


@pytest.mark.parametrize("name,expected", [("0.5.19", ("violated", 8)), ("0.5.20", ("violated", 8)),
                                           ("0.5.21", ("violated", 9)),
                                           ("0.5.22", ("violated", 9))])
def test_each_release_as_its_code_decides_with_timeouts(name, expected):
    got = verdict(releases.get(name), WITH_TIMEOUTS)
    assert got[:2] == expected


@pytest.mark.slow
def test_agreed_releases_hold_with_timeouts_too():
    # about 100 k states each: every interleaving of the timeouts is explored
    assert verdict(releases.get("0.5.23"), WITH_TIMEOUTS)[0] == "holds"
    rel = attrs.evolve(releases.get("0.5.21"), release_reduced=True)
    assert verdict(rel, WITH_TIMEOUTS)[0] == "holds"


def test_a_deadline_that_passes_on_one_rank_splits_them():
    # 0.5.21: every rank holds (force_arm); rank 0's own clock passes the
    # 30 s deadline first, and the next pop_preallocated admits request 1
    # on rank 0 only
    _, _, trace = verdict(releases.get("0.5.21"), WITH_TIMEOUTS)
    actions = [(st.action, tuple(st.arg)) for st in trace.steps]
    assert actions[-1][0] == "d_prealloc_splits" and actions[-2][0] == "d_deferred_timeout"
    assert actions[-2][1] in ((0,), (1,))


def test_the_split_follows_a_drain_ack_on_one_rank():
    # without timeouts: rank 0's drain ack ends its hold while rank 1's is
    # still on its way
    _, length, trace = verdict(releases.get("0.5.21"), ABORT_ONLY)
    actions = [st.action for st in trace.steps]
    assert length == 11 and actions[-1] == "d_prealloc_splits" and actions[-2] == "d_recv_ack"
    split = [e for e in trace.events[-1] if isinstance(e, RanksSplit)]
    assert len(split) == 1 and split[0].rid == 1
    assert sorted(split[0].took + split[0].kept) == [0, 1] and split[0].call == "pop_preallocated"


def test_the_deadline_passes_on_every_rank_at_once_on_0_5_23():
    rel = releases.get("0.5.23")
    ctx = Ctx(rel, ADMISSION)
    from reqmodel.model.actions import BY_NAME
    held = DecodeReq(stage=DStage.HELD, origin_pages=1, pages=(0,), held=(0, 1))
    s = State(p=(), d=(held, DecodeReq()), rooms=(), d_pages=(Page(owner=0),), d_slots=(),
              d_rooms=())
    timeout = BY_NAME["d_deferred_timeout"]
    assert list(timeout.args(ctx, s, 0)) == [()]
    ctx21 = Ctx(releases.get("0.5.21"), ADMISSION)
    assert list(timeout.args(ctx21, s, 0)) == [(0,), (1,)]


def test_reduced_release_keeps_the_ranks_in_step():
    rel = attrs.evolve(releases.get("0.5.21"), release_reduced=True)
    assert verdict(rel, ADMISSION)[0] == "holds"


def test_per_rank_release_on_0_5_23_splits_them():
    rel = attrs.evolve(releases.get("0.5.23"), release_reduced=False)
    assert verdict(rel, ADMISSION)[0] == "violated"


def test_a_hold_on_the_notifying_rank_only_splits_at_once():
    # 0.5.19/0.5.20: a rank whose receiver did not send ABORT (its waiting
    # timeout has not fired yet) releases at the failure, even with a
    # reduced release decision
    rel = attrs.evolve(releases.get("0.5.19"), release_reduced=True)
    _, length, trace = verdict(rel, WITH_TIMEOUTS)
    assert length == 8 and trace.steps[-2].action == "d_transferred"


@pytest.mark.slow
def test_room_for_both_keeps_the_ranks_in_step():
    roomy = attrs.evolve(ADMISSION, decode=attrs.evolve(ADMISSION.decode, pool_pages=2))
    for name in ("0.5.19", "0.5.21"):
        assert verdict(releases.get(name), roomy)[0] == "holds", name


def _two_requests(released_on=(), owner=0):
    d0 = DecodeReq(stage=DStage.HELD, origin_pages=1, pages=(0,), held=(1,),
                   released_on=released_on)
    d1 = DecodeReq(stage=DStage.PREALLOC, origin_pages=1)
    return State(p=(), d=(d0, d1), rooms=(), d_pages=(Page(owner=owner),), d_slots=())


def test_each_rank_reads_its_own_pool():
    s = _two_requests(released_on=(0,))
    assert s.free_d_pages() == ()
    assert s.rank_free_pages(0) == (0,) and s.rank_free_pages(1) == ()


def test_relabelling_ranks_renames_their_releases():
    s = _two_requests(released_on=(0,))
    t = permute_ranks(attrs.evolve(s, d=(attrs.evolve(s.d[0], split=(0,)), s.d[1])), (1, 0))
    assert t.d[0].released_on == (1,) and t.d[0].split == (1,) and t.d[0].held == (0,)


def test_nothing_moves_after_the_split():
    rel = releases.get("0.5.21")
    _, _, trace = verdict(rel, ADMISSION)
    ctx = Ctx(rel, ADMISSION)
    last = trace.states[-1]
    assert last.diverged() and last.halted() and not last.crashed()
    assert list(enabled(ctx, last)) == []


def test_one_decode_rank_never_splits():
    one = from_dict({"name": "one", "prompt_pages": [1, 1], "prefill": {"pool_pages": 2},
                     "decode": {"pool_pages": 1}, "options": {"deferred_release": True},
                     "events": {"timeouts": [0]}})
    assert verdict(releases.get("0.5.21"), one)[0] == "holds"
