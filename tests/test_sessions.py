"""``session-mark-released``: a streaming session's in-flight mark
(``Session._inflight``, set by ``create_req``) is cleared only by
``finish_req`` / ``abort_req``, which a request's end reaches through
``release_kv_cache`` on a request holding KV, the door's retire (0.5.21+)
and ``_release_aborted_request`` (0.5.22+).  A request that ends without
KV keeps the mark: the session refuses the next turn, and a close before
it never completes (notes/verdicts.md, "What a session is left with")."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply, enabled
from reqmodel.model.leftover import session_turns_ended
from steps import RUNNING, run_steps

SMR = properties.CATALOG["session-mark-released"]
PD_SESSIONS = [r for r in releases.NAMES if releases.get(r).pd_session_requests]


def _ctx(rel, name, **kw):
    return Ctx(releases.get(rel), attrs.evolve(scenario.builtin(name), sessions=True, **kw))


def test_session_requests_are_pd_requests_from_0_5_20():
    """0.5.19's ``Session.create_req`` builds the ``Req`` without the
    bootstrap fields (SC 19:292): the property does not apply there."""
    assert PD_SESSIONS == ["0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    sc = scenario.builtin("pause-abort")
    assert not SMR.applies(releases.get("0.5.19"), sc)
    assert SMR.applies(releases.get("0.5.20"), sc)
    assert not SMR.applies(releases.get("0.5.20"), scenario.builtin("abort-reaches-decode"))


@pytest.mark.parametrize("rel", PD_SESSIONS)
def test_a_completed_request_ends_its_turn_on_both_workers(rel):
    """Prefill's inflight Success and decode's finish release KV
    (``release_kv_cache`` -> ``finish_req``)."""
    ctx = _ctx(rel, "abort-reaches-decode")
    s = run_steps(ctx, RUNNING[:2])
    assert s.p[0].session_slot and s.d[0].session_slot
    s = run_steps(ctx, RUNNING[2:] + (Step("d_respond", 0),), s)
    assert not s.p[0].session_slot and not s.d[0].session_slot
    assert s.d[0].stage.name == "GONE" and session_turns_ended(s)


@pytest.mark.parametrize("rel", PD_SESSIONS)
def test_an_abort_in_decode_s_prealloc_queue_leaves_the_mark_set(rel):
    """``receiver.abort()``; the next ``pop_preallocated`` answers the
    failure without ``release_kv_cache`` (no KV yet): the mark stays, on
    every release."""
    ctx = _ctx(rel, "abort-reaches-decode")
    s = run_steps(ctx, (Step("d_intake", 0), Step("d_door", 0), Step("d_abort", 0),
                        Step("d_prealloc_drop", 0)))
    assert s.d[0].stage.name == "GONE" and s.d[0].session_slot
    assert not session_turns_ended(s)


@pytest.mark.parametrize("rel", PD_SESSIONS)
def test_an_abort_in_decode_s_waiting_queue_ends_the_turn(rel):
    ctx = _ctx(rel, "abort-reaches-decode")
    s = run_steps(ctx, RUNNING[:-1] + (Step("d_abort", 0),))
    assert s.d[0].stage.name == "GONE" and not s.d[0].session_slot


@pytest.mark.parametrize("rel", PD_SESSIONS)
def test_prefill_s_bootstrap_queue_abort_ends_the_turn_from_0_5_22(rel):
    """0.5.22's ``abort_request`` calls ``_release_aborted_request`` on a
    bootstrap-queue entry (sch 22:5531 -> 3423); before, the bootstrap
    failure that follows holds no KV and ``handle_bootstrap_failure``
    skips ``release_kv_cache`` (pf 20:1143, 21:1200)."""
    ctx = _ctx(rel, "abort-reaches-prefill")
    s = run_steps(ctx, (Step("p_intake", 0), Step("p_door", 0), Step("p_abort", 0)))
    clears = releases.get(rel).release_aborted_clears_session
    assert s.p[0].session_slot is not clears
    s = run_steps(ctx, (Step("p_pop_bootstrapped", 0),), s)
    assert s.p[0].stage.name == "GONE" and s.p[0].session_slot is not clears
    assert session_turns_ended(s) is clears


@pytest.mark.parametrize("rel", PD_SESSIONS)
def test_a_retraction_ends_the_turn_while_the_request_lives(rel):
    """``release_req`` -> ``release_kv_cache`` -> ``finish_req`` (sb
    21:2268): the mark is cleared though the request comes back; an abort
    in the retracted queue then finds it cleared."""
    ctx = _ctx(rel, "retract-abort")
    s = run_steps(ctx, RUNNING + (Step("d_retract", 0),))
    assert s.d[0].stage.name != "GONE" and not s.d[0].session_slot


def test_prefill_s_recompute_request_belongs_to_no_session():
    """``build_rebootstrap_payload`` carries no session (sb 21:2077-2105):
    the new prefill ``Req`` that recomputes a paused request holds no mark."""
    ctx = _ctx("0.5.21", "pause-abort")
    s = run_steps(ctx, RUNNING + (Step("d_pause_retract", 0),))
    seen = set()
    frontier = [s]
    while frontier:  # the few steps from the pause to prefill taking the payload
        s = frontier.pop()
        if apply(ctx, s, Step("p_recompute", 0)) is not None:
            break
        for a, r in enabled(ctx, s):
            for arg in (a.args(ctx, s, r) if a.choices is not None else [()]):
                out = apply(ctx, s, Step(a.name, r, arg))
                if out is not None and out[0] not in seen and len(seen) < 5000:
                    seen.add(out[0])
                    frontier.append(out[0])
    post, _ = apply(ctx, s, Step("p_recompute", 0))
    assert post.p[0].stage.name == "DOOR" and not post.p[0].session_slot


@pytest.mark.parametrize("rel", PD_SESSIONS)
def test_the_exhaustive_search_finds_the_prealloc_abort(rel):
    """The shortest counterexample on ``pause-abort`` is four steps: decode's
    prealloc abort, or before 0.5.22 prefill's bootstrap-queue abort too."""
    v = explore.explore(releases.get(rel), scenario.builtin("pause-abort"), [SMR]).verdicts[SMR.name]
    assert v.verdict == "violated"
    ways = [["d_intake", "d_door", "d_abort", "d_prealloc_drop"]]
    if not releases.get(rel).release_aborted_clears_session:
        ways.append(["p_intake", "p_door", "p_abort", "p_pop_bootstrapped"])
    assert [st.action for st in v.trace.steps] in ways


@pytest.mark.parametrize("name", ["incident", "both-reject", "decode-reject"])
def test_it_holds_where_no_request_ends_without_kv(name):
    v = explore.explore(releases.get("0.5.23"), scenario.builtin(name), [SMR]).verdicts[SMR.name]
    assert v.verdict == "holds"


@pytest.mark.parametrize("name", ["pause-abort", "retract-abort", "pause-abort-overlap"])
def test_the_fix_ends_the_turn_on_every_exit(name):
    """The proposal ``session-abort-on-every-exit`` (0.5.23 whose exits
    without KV call the session's ``abort_req``, as the door's retire does)
    makes the property hold where 0.5.23 fails it."""
    from reqmodel.proposals.mutants import MUTANTS
    fixed = MUTANTS["session-abort-on-every-exit"]
    assert fixed.exits_abort_session_turn and not releases.get("0.5.23").exits_abort_session_turn
    v = explore.explore(fixed, scenario.builtin(name), [SMR]).verdicts[SMR.name]
    assert v.verdict == "holds"
