"""The lists an abort reaches (issue #23): ``abort_request`` scans the same
queues on every release, and none of them holds a decode request paused for
rebootstrap (``held_rebootstrap_reqs``), so the abort is lost and the request
comes back on ``continue_generation`` as if never aborted.
``client-abort-honoured`` says what the client may expect once its abort
reached a worker.  Each test fails if the held request becomes abortable in
the model without the code changing, or if the property stops telling a
lost abort from method 3's one pass."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import actions, properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply
from reqmodel.model.state import DStage
from reqmodel.traces import itf
from steps import RUNNING, run_steps

HONOURED = properties.CATALOG["client-abort-honoured"]

def _ctx(name, release="0.5.21"):
    return Ctx(releases.get(release), scenario.builtin(name))


def test_an_abort_for_a_request_held_for_rebootstrap_is_lost():
    ctx = _ctx("pause-abort-overlap")
    s = run_steps(ctx, list(RUNNING) + [Step("d_pause_retract", 0)])
    assert s.d[0].stage is DStage.DOOR and s.d[0].door_flag == "rebootstrap"
    assert actions.BY_NAME["d_abort"].enabled(ctx, s, 0)
    s2 = run_steps(ctx, [Step("d_abort", 0)], s)
    # the scheduler saw it, nothing holds a verdict: no to_finish, no answer
    assert s2.d[0].client_aborted
    assert (s2.d[0].to_finish, s2.d[0].finished_reason, s2.d[0].answer) == (None, None, None)
    # on continue_generation it is re-added as a rebootstrap and preallocated
    s3 = run_steps(ctx, [Step("d_door", 0)], s2)
    assert s3.d[0].stage is DStage.PREALLOC


def test_a_memory_retraction_is_requeued_in_the_same_iteration():
    """retract_decode's requeue (is_retracted=True) is not a hold: no abort
    can be read in between."""
    ctx = _ctx("retract-abort")
    s = run_steps(ctx, list(RUNNING) + [Step("d_retract", 0)])
    assert s.d[0].door_flag == "retracted"
    assert not actions.BY_NAME["d_abort"].enabled(ctx, s, 0)


@pytest.mark.parametrize("release", ["0.5.20", "0.5.21", "0.5.23"])
def test_the_lost_abort_ends_in_a_forward_pass_for_an_aborted_client(release):
    res = explore.explore(releases.get(release), scenario.builtin("pause-abort-overlap"), [HONOURED])
    v = res.verdicts[HONOURED.name]
    assert v.verdict == "violated"
    names = [st.action for st in v.trace.steps]
    assert names.index("d_pause_retract") < names.index("d_abort") < names.index("d_door", names.index("d_pause_retract"))
    assert names[-1] == "d_attend"


def test_method_3s_one_pass_is_allowed():
    """The client aborts a running request (to_finish), retract_decode
    requeues it with its host backup, and the resumed request is attended
    once more before the pass that promotes the abort: allowed."""
    ctx = _ctx("retract-abort")
    s = run_steps(ctx, list(RUNNING) + [Step("d_abort", 0), Step("d_retract", 0), Step("d_door", 0),
                                  Step("d_resume", 0, (0, (0, 1)))])
    s2, evs = apply(ctx, s, Step("d_attend", 0))
    assert s.d[0].to_finish is not None
    assert HONOURED.holds_on(s, Step("d_attend", 0), evs, s2)
    # the same pass for a request whose abort left no verdict is a violation
    lost = attrs.evolve(s, d=(attrs.evolve(s.d[0], to_finish=None),) + s.d[1:])
    assert not HONOURED.holds_on(lost, Step("d_attend", 0), evs, s2)


@pytest.mark.parametrize("name,cells", [
    ("pause-abort-overlap", ["F", "F", "F", "F", "F"]),
    ("retract-abort", ["F", "H", "H", "H", "H"]),
    ("abort-reaches-decode", ["H", "H", "H", "H", "H"]),
])
def test_verdicts(name, cells):
    got = []
    for rel in releases.NAMES:
        v = explore.explore(releases.get(rel), scenario.builtin(name), [HONOURED]).verdicts
        got.append("F" if v[HONOURED.name].verdict == "violated" else "H")
    assert got == cells


def test_the_history_flag_stays_out_of_traces_that_do_not_set_it():
    ctx = _ctx("incident")
    s = run_steps(ctx, [Step("p_intake", 0)])
    assert "abort_reached" not in itf.encode(s.p[0])
    ctx = _ctx("retract-abort")
    s = run_steps(ctx, [Step("p_intake", 0), Step("p_door", 0), Step("p_abort", 0)])
    assert itf.encode(s.p[0])["abort_reached"] is True


def test_the_host_backup_is_a_resource_released_once():
    """retract_decode takes a host backup; resuming loads and frees it, and
    an abort in the retracted queue discards it (discard_kv_cache_backup):
    each is a release event of a held resource, and a finished request
    that still holds one breaks release-exactly-once."""
    once = properties.CATALOG["release-exactly-once"]
    ctx = _ctx("retract-abort")
    s = run_steps(ctx, list(RUNNING) + [Step("d_retract", 0), Step("d_door", 0)])
    assert s.d[0].retraction_backup
    for step in (Step("d_abort", 0), Step("d_resume", 0, (0, (0, 1)))):
        s2, evs = apply(ctx, s, step)
        assert not s2.d[0].retraction_backup
        assert [(e.resource, e.held) for e in evs if e.kind == "release"] == [("backup", True)]
        assert once.holds_in(s2) and once.holds_on(s, step, evs, s2)
    leaked = attrs.evolve(s, d=(attrs.evolve(s.d[0], stage=DStage.GONE),) + s.d[1:])
    assert not once.holds_in(leaked)
